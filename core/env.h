#pragma once
// Note [Environment switches]
// A few switches are environment variables rather than config keys because they choose between
// implementations of the same arithmetic (which kernel, which fusion) and are meant for benchmarks
// and investigations, not for training configs: STRATA_ATTENTION, STRATA_LINEAR_EPILOGUE,
// STRATA_LINEAR_DGELU, STRATA_CE_ROW_CACHE, STRATA_FUSED_OPS, STRATA_GRAD_INTO_BUFFER,
// STRATA_NORM_GRADS, STRATA_DECODE_ATTENTION, STRATA_DEVICE_CANDIDATES (the sampler's),
// STRATA_MATMUL_TUNE (with the path STRATA_MATMUL_TUNE_FILE; `train` takes run.matmul_tuning
// instead, Note [cuBLASLt tuning]); and
// STRATA_GPU_POISON, a debugging aid (Note [GPU caching allocator]). Each is read with env_choice,
// so they behave alike: unset or empty is the default (the first choice); a value that names no
// choice is a UserError that names the variable and lists every choice with its meaning.
#include <initializer_list>
#include <string>

namespace strata {

struct EnvChoice {
  const char* value;    // what the variable is set to, e.g. "off"
  const char* meaning;  // a few words for the error message
};

// The index in `choices` of the value of environment variable `name`; 0 (the default) when it
// is unset or empty. Throws UserError for any other value.
int env_choice(const char* name, std::initializer_list<EnvChoice> choices);

// The message of that UserError (exposed for tests).
std::string env_choice_error(const char* name, const std::string& value,
                             std::initializer_list<EnvChoice> choices);

}  // namespace strata
