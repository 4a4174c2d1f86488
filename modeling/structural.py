"""Structural attention (Chowdhury et al.; Liu & Lapata 2018 "Learning Structured Text Representations"):
a non-projective dependency tree over the units of a cluster as a latent variable, its edge and root
marginals computed exactly with the matrix-tree theorem (Koo et al. 2007, single root).

With edge weights A[i, j] = exp(s[i, j]) (unit i is the parent of unit j, i != j) and root weights
r[j] = exp(rho[j]): the Laplacian L[j, j] = sum_i A[i, j], L[i, j] = -A[i, j]; L-bar = L with its first row
replaced by r. Then
    P(i -> j)   = (1 - [j = 0]) A[i, j] Linv[j, j] - (1 - [i = 0]) A[i, j] Linv[j, i]
    P(root -> j) = r[j] Linv[j, 0]
Stability: every tree has n factors (n - 1 edges, one root), so one shift by the cluster's largest score
leaves the marginals unchanged and keeps exp finite; the solve runs in float64 (the released code of
Chowdhury et al. exponentiates raw scores and overflows). Padding units get an identity block in L-bar:
the determinant and the real units' marginals do not change, their own marginals are 0.
"""
from __future__ import annotations

import torch
from torch import Tensor, nn


def matrix_tree_marginals(edge_scores: Tensor, root_scores: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """edge_scores [C, W, W] (s[i, j]: i parent of j), root_scores [C, W], mask [C, W] bool (real units first)
    -> (edge marginals [C, W, W], root marginals [C, W]) in the input dtype."""
    dtype = edge_scores.dtype
    s, rho = edge_scores.double(), root_scores.double()
    m = mask.bool()
    pair = m[:, :, None] & m[:, None, :]
    eye = torch.eye(s.shape[-1], dtype=torch.bool, device=s.device)
    pair = pair & ~eye
    neg = torch.finfo(torch.float64).min
    top = torch.maximum(s.masked_fill(~pair, neg).amax((1, 2)), rho.masked_fill(~m, neg).amax(1))  # [C]
    top = top.detach()[:, None]
    # zero the masked scores BEFORE exp: a discarded inf still sends 0 * inf = NaN into the backward
    a = torch.where(pair, (s - top[:, :, None]).masked_fill(~pair, 0.0).exp(), torch.zeros_like(s))
    r = torch.where(m, (rho - top).masked_fill(~m, 0.0).exp(), torch.zeros_like(rho))
    lap = torch.diag_embed(a.sum(1)) - a
    lap = torch.where(m[:, :, None] | m[:, None, :], lap, eye.to(lap.dtype).expand_as(lap))  # padding: identity
    lap_bar = torch.cat([r[:, None, :], lap[:, 1:, :]], dim=1)
    inv = torch.linalg.inv(lap_bar)                         # [C, W, W]
    diag = torch.diagonal(inv, dim1=1, dim2=2)              # Linv[j, j]
    not_first = torch.ones_like(r)
    not_first[:, 0] = 0
    edge = a * not_first[:, None, :] * diag[:, None, :] - a * not_first[:, :, None] * inv.transpose(1, 2)
    root = r * inv[:, :, 0]
    return edge.to(dtype), root.to(dtype)


class StructuralAttention(nn.Module):
    """Structure-aware unit vectors: bilinear parent/child scores and root scores from the unit vectors, the
    tree marginals, and tanh(W [v; sum_i P(i -> j) v_i (expected parent); sum_k P(j -> k) v_k (expected
    children)]) — Chowdhury et al. §2 / Liu & Lapata 2018 §3."""

    def __init__(self, hidden: int):
        super().__init__()
        self.parent = nn.Linear(hidden, hidden)
        self.child = nn.Linear(hidden, hidden)
        self.bilinear = nn.Parameter(torch.empty(hidden, hidden))
        self.root = nn.Linear(hidden, 1)
        self.out = nn.Linear(3 * hidden, hidden)
        nn.init.xavier_uniform_(self.bilinear)

    def forward(self, units: Tensor, mask: Tensor) -> Tensor:
        """units [C, W, H], mask [C, W] -> structure-aware unit vectors [C, W, H] (0 at padding)."""
        p, c = torch.tanh(self.parent(units)), torch.tanh(self.child(units))
        scores = p @ self.bilinear.to(p.dtype) @ c.transpose(1, 2)   # [C, W(parent), W(child)]
        edge, _ = matrix_tree_marginals(scores.float(), self.root(units).squeeze(-1).float(), mask)
        edge = edge.to(units.dtype)
        parents = edge.transpose(1, 2) @ units   # row j: sum_i P(i -> j) v_i
        children = edge @ units                  # row i: sum_k P(i -> k) v_k
        out = torch.tanh(self.out(torch.cat([units, parents, children], dim=-1)))
        return out * mask[..., None].to(out.dtype)
