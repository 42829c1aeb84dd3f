#include "core/device.h"

#include "core/error.h"

namespace strata {

std::string Device::str() const {
  return is_cpu() ? std::string("cpu") : "cuda:" + std::to_string(index);
}

Device parse_device(const std::string& s) {
  if (s == "cpu") return Device::cpu();
  if (s == "cuda") return Device::cuda(0);
  if (s.rfind("cuda:", 0) == 0) {
    try {
      return Device::cuda(std::stoi(s.substr(5)));
    } catch (const std::exception&) {
    }
  }
  user_error("unknown device '{}': expected cpu, cuda or cuda:N", s);
}

}  // namespace strata
