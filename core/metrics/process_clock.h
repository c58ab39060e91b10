// Seconds since this process started (more exactly: since its static objects were made, before
// main() and MPI's start-up), so the log can say what start-up cost before the first step.
#pragma once

namespace pt {

double seconds_since_process_start();

}  // namespace pt
