// The spike threshold the rollback tests set (run.spike). Their tiny models train on random
// tokens, so the loss wanders by a few hundredths from step to step, and over a window of 3-4
// losses the ratio (loss - mean) / sd is Student's t with 2-3 degrees of freedom: heavy-tailed.
// At 4 standard deviations a clean step is called a spike in about 2% of steps, so a test at 4
// passed or failed by the initial weights' luck. The injected spike (the loss made 10x, about
// +40) is thousands of deviations out; at 100 a clean step crosses in under 1e-4 of steps.
#pragma once
#include <string>

namespace pt::test {

inline constexpr int kSpikeSigmas = 100;
inline const std::string kSpikeSetting = "run.spike=" + std::to_string(kSpikeSigmas);

}  // namespace pt::test
