// train: trains a model from a YAML config (docs/config.md).
//
//   train --config configs/default.yaml [--set optimizer.lr=1e-3 ...] [--print-config]
//
// Exit status: 0 finished, 1 bad input (config, data, checkpoint, run directory — the message
// names the file and what to fix), 2 internal error, 130 interrupted (a checkpoint was written;
// the same command resumes).
#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <csignal>
#include <cstdio>
#include <string>
#include <vector>

#include "core/error.h"
#include "comm/world.h"
#include "runtime/train_config.h"
#include "runtime/trainer.h"

namespace {

extern "C" void on_signal(int sig) {
  strata::runtime::Trainer::request_stop();
  // A second signal ends the process at once (Note [Interrupts] in runtime/trainer.h).
  std::signal(sig, SIG_DFL);
}

// " (rank 3 of 8)" under a launcher, "" for one process.
std::string rank_label() {
  const strata::comm::LaunchInfo l = strata::comm::detect_launch();
  return l.size > 1 ? fmt::format(" (rank {} of {})", l.rank, l.size) : std::string();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Strata: train a GPT-style model from a YAML config (see docs/config.md)", "train"};
  std::string config_path;
  std::vector<std::string> sets;
  bool print_config = false;
  app.add_option("-c,--config", config_path, "the YAML config file")->required();
  app.add_option("--set", sets, "override a config key, e.g. --set optimizer.lr=3e-4 (repeatable)")
      ->take_all();
  app.add_flag("--print-config", print_config, "print the fully resolved config and exit");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  int code = 0;
  try {
    strata::runtime::TrainConfig config = strata::runtime::load_train_config(config_path, sets);
    if (print_config) {
      fmt::print("{}", strata::runtime::to_yaml(config));
      return 0;
    }
    std::signal(SIGINT, on_signal);
    std::signal(SIGTERM, on_signal);
    strata::runtime::Trainer trainer(std::move(config));
    auto outcome = trainer.run();
    if (outcome == strata::runtime::Trainer::Outcome::Interrupted) {
      if (trainer.rank() == 0)
        fmt::print(stderr,
                   "train: interrupted at step {}; checkpoint {} written; run the same "
                   "command again to resume\n",
                   trainer.step(), trainer.last_checkpoint());
      code = 130;
    }
  } catch (const strata::UserError& e) {
    fmt::print(stderr, "train: error{}: {}\n", rank_label(), e.what());
    code = 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "train: internal error{}: {}\n", rank_label(), e.what());
    code = 2;
  }
  // One rank's error must not leave the others waiting in a collective (Note [Failed ranks]).
  if ((code == 1 || code == 2) && strata::comm::detect_launch().size > 1)
    strata::comm::abort_world(code);
  strata::comm::finalize_world();
  return code;
}
