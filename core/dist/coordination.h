// Host-side coordination over a Comm: agreeing on failures and exchanging small strings (the
// checkpoint writers' chunk lists). Control messages, not tensors: they travel in host memory,
// so the group must be one whose Comm takes host buffers (MpiComm, LocalComm; a NCCL run keeps
// an MPI world communicator for this).
#pragma once
#include <exception>
#include <string>
#include <vector>

#include "core/dist/comm.h"

namespace pt {

// Whether `failure` (null: none) is a ConfigError, the kind agree and agree_on_startup (world.h)
// pass on to the ranks that did not fail.
bool is_config_error(std::exception_ptr failure);

// The lowest group rank whose `flag` is true, or -1. Collective.
int first_rank_with(Comm& group, bool flag);

// Every rank passes the exception its part of a joint operation threw (or nullptr). If any rank
// failed, every rank throws: the failed ones their own exception, the others an exception of the
// same kind (ConfigError or RuntimeError) naming the lowest failed rank and `what`. Collective.
void agree(Comm& group, std::exception_ptr local_failure, const std::string& what);

// Every rank's `text`, in group rank order. Collective.
std::vector<std::string> all_gather_strings(Comm& group, const std::string& text);

// `text` of group rank `root`, on every rank. Collective.
std::string broadcast_string(Comm& group, const std::string& text, int root);

}  // namespace pt
