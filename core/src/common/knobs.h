// Every tunable read from the environment, declared once in knobs.cc with its default and a
// one-line doc (NCCL_PARAM style). Python reads the same table through nezha._core.knobs().
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace nezha {

struct KnobSpec {
  const char* env;            // e.g. "NEZHA_FUSION_THRESHOLD"
  const char* default_value;  // as it would be written in the environment
  const char* doc;            // one line
};

const std::vector<KnobSpec>& knob_table();

// Value from the environment, or the table default. Throws InvalidArgument for a name missing from
// the table (a typo in code) or a value that does not parse.
std::string knob_string(const char* env);
int64_t knob_int(const char* env);
double knob_double(const char* env);

}  // namespace nezha
