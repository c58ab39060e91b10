#include "core/dist/local_comm.h"

#include <cstring>

namespace pt {

void LocalComm::copy_block(Tensor dst, Tensor src, const char* what) {
  check(dst.numel == src.numel && dst.dtype == src.dtype,
        std::string(what) + ": a group of one needs send and recv of the same size and dtype (send " +
            std::to_string(src.numel) + ", recv " + std::to_string(dst.numel) + " elements)");
  if (dst.data == src.data) return;
  if (ops_) ops_->copy(dst, src, src.numel);
  else std::memmove(dst.data, src.data, src.bytes());
}

void LocalComm::reduce_scatter(Tensor send, Tensor recv) { copy_block(recv, send, "reduce_scatter"); }
void LocalComm::all_gather(Tensor send, Tensor recv) { copy_block(recv, send, "all_gather"); }
void LocalComm::all_to_all(Tensor send, Tensor recv) { copy_block(recv, send, "all_to_all"); }

void LocalComm::broadcast(Tensor, int root) {
  check(root == 0, "broadcast: root " + std::to_string(root) + " is not in a group of one");
}

void LocalComm::send(Tensor, int peer) {
  throw RuntimeError("send to peer " + std::to_string(peer) + ": a group of one has no other rank");
}
void LocalComm::recv(Tensor, int peer) {
  throw RuntimeError("recv from peer " + std::to_string(peer) + ": a group of one has no other rank");
}

}  // namespace pt
