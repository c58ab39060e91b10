"""picotrain's training pass in float64 on the models: the loss (and with experts the balancing loss
added to it) and the gradients of that objective by autograd, as the reference each dump is
compared with; and the bf16 rounding of the weights the bf16 backend computes with.
"""
import torch
import torch.nn.functional as F

from .models import forward


def round_bf16(a):
    """fp32 -> bf16 -> fp32 with round-to-nearest-even, as picotrain's bf16 backend rounds."""
    return torch.from_numpy(a).to(torch.bfloat16).to(torch.float32).numpy()


def objective(w, model, tokens, targets, routing=None):
    """What picotrain's training pass computes on ids and targets [B, T] (torch): (logits [B*T, Vp],
    the loss, the balancing loss, the routing margin, the objective). The loss (picotrain's
    logged one) is (sum of per-token cross-entropies over the first vocab_size logits) / (B*T),
    targets of -1 ignored; a model with experts adds moe.aux_loss_coef times the mean of its
    sparse blocks' balancing losses (over every row of the batch) to it to make the objective,
    whose gradient picotrain's backward computes. Without experts the balancing loss and the
    margin are None and the objective is the loss. With experts, the margin is (the smallest gap,
    rows routed otherwise than float64 would, the largest shortfall: sparse_moe) and `routing`
    (a dump's choices [sparse blocks, B*T, top_k]) routes the tokens when given."""
    B, T = tokens.shape
    routed = []
    logits = forward(w, model, tokens, routed, routing).view(B * T, -1)
    loss = F.cross_entropy(logits[:, :model["vocab_size"]], targets.view(B * T), ignore_index=-1,
                           reduction="sum") / (B * T)
    if not routed:
        return logits, loss, None, None, loss
    aux = torch.stack([r[0] for r in routed]).mean()
    margin = (min(r[1] for r in routed), sum(r[2] for r in routed), max(r[3] for r in routed))
    return logits, loss, aux, margin, loss + model["moe"]["aux_loss_coef"] * aux


def reference(weights, model, tokens, targets, device, routing=None):
    """(logits [B*T, padded_vocab], loss, {name: gradient of the objective}, balancing loss,
    routing margin): arrays float64 numpy, the last two None without experts; routed as
    `routing` says when given (objective)."""
    w = {name: torch.tensor(a, dtype=torch.float64, device=device).requires_grad_(True) for name, a in weights.items()}
    tok = torch.tensor(tokens, dtype=torch.long, device=device)
    tgt = torch.tensor(targets, dtype=torch.long, device=device)
    logits, loss, aux, margin, total = objective(w, model, tok, tgt, routing)
    total.backward()
    # An expert no token chose takes no part in the graph: its gradient is zero.
    grads = {name: (t.grad if t.grad is not None else torch.zeros_like(t)).detach().cpu().numpy()
             for name, t in w.items()}
    return (logits.detach().cpu().numpy(), float(loss.item()), grads,
            None if aux is None else float(aux.item()), margin)
