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

from typing import Literal

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
    """Structure-infused unit vectors (Chowdhury et al. §2.2, after Liu & Lapata 2018 §3). Each unit vector h
    is split into a semantic part e and a structural part d (eq. 1: [e, d] = h); parent/child scores
    f_jk = tanh(W_c d_k)^T W_a tanh(W_p d_j) and root scores f^r_j = W_r d_j give the tree marginals a_jk and
    a^r_j (eq. 2); then
        s_i = a^r_i e_root + sum_k a_ki e_k   (expected parent; e_root a learned vector)
        c_i = sum_k a_ik e_k                  (expected children: Liu & Lapata's form; the paper prints e_i)
        r_i = tanh(W [e_i; s_i; c_i]).
    `split=False` scores and aggregates the whole vector (e = d = h); `root=False` drops the root term — both
    off is the earlier form, which exports without these switches were trained with."""

    def __init__(self, hidden: int, split: bool = True, root: bool = True):
        super().__init__()
        self.split, self.use_root = split, root
        d_dim = hidden // 2 if split else hidden           # structural part d: the second half
        self.e_dim = hidden - d_dim if split else hidden   # semantic part e: the first half
        self.parent = nn.Linear(d_dim, d_dim)
        self.child = nn.Linear(d_dim, d_dim)
        self.bilinear = nn.Parameter(torch.empty(d_dim, d_dim))
        self.root = nn.Linear(d_dim, 1)
        self.root_vector = nn.Parameter(torch.zeros(self.e_dim)) if root else None   # e_root
        self.out = nn.Linear(3 * self.e_dim, hidden)
        nn.init.xavier_uniform_(self.bilinear)
        if root:
            nn.init.normal_(self.root_vector, std=0.02)

    def forward(self, units: Tensor, mask: Tensor) -> Tensor:
        """units [C, W, H], mask [C, W] -> structure-infused unit vectors r [C, W, H] (0 at padding)."""
        e, d = (units[..., : self.e_dim], units[..., self.e_dim:]) if self.split else (units, units)
        p, c = torch.tanh(self.parent(d)), torch.tanh(self.child(d))
        scores = p @ self.bilinear.to(p.dtype) @ c.transpose(1, 2)   # [C, W(parent), W(child)]
        edge, root = matrix_tree_marginals(scores.float(), self.root(d).squeeze(-1).float(), mask)
        edge = edge.to(e.dtype)
        parents = edge.transpose(1, 2) @ e       # row j: sum_i P(i -> j) e_i
        if self.root_vector is not None:         # + P(root -> j) e_root
            parents = parents + root.to(e.dtype)[..., None] * self.root_vector.to(e.dtype)
        children = edge @ e                      # row i: sum_k P(i -> k) e_k
        out = torch.tanh(self.out(torch.cat([e, parents, children], dim=-1)))
        return out * mask[..., None].to(out.dtype)


class StructuralContext(nn.Module):
    """The decoder's structural context (Chowdhury et al. §2.2-2.3): at every step, attention from the decoder
    state s over the cluster's structure-infused unit vectors g, c_struct = sum_u a_struct,u h_u over the unit
    vectors h. c_struct feeds P_vocab and p_gen; copying keeps the plain token attention ("to facilitate token
    level pointing").

    `form="additive"` is the paper's: e_u = v^T tanh(W_g g_u + W_s s + b_attn), a_struct = softmax_u(e), one
    head, c_struct = sum_u a_u h_u; `out` then stands for the block of See et al.'s V[s_t; c_t] that reads c
    (here the vocabulary projection reads s + out(c)). `form="dot"` (the earlier form): per head
    softmax(q(s) . k(g_u) / sqrt(d)), values v(h_u), heads concatenated, then `out`."""

    def __init__(self, hidden: int, heads: int, form: Literal["additive", "dot"] = "additive"):
        super().__init__()
        if form not in ("additive", "dot"):
            raise ValueError(f"unknown structural attention form {form!r} (additive, dot)")
        self.heads, self.form = heads, form
        self.scale = (hidden // heads) ** -0.5
        if form == "additive":
            self.w_g = nn.Linear(hidden, hidden, bias=False)   # W_g (b_attn sits in W_s)
            self.w_s = nn.Linear(hidden, hidden)               # W_s, b_attn
            self.score = nn.Linear(hidden, 1, bias=False)      # v
        else:
            self.q, self.k, self.v = (nn.Linear(hidden, hidden) for _ in range(3))
        self.out = nn.Linear(hidden, hidden)

    def prepare(self, structure: Tensor, units: Tensor, mask: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """structure g [B, D, H], unit vectors h [B, D, H], mask [B, D] -> keys and values (additive: W_g g and h,
        [B, D, H]; dot: per head [B, h, D, d]) and the additive key mask [B, 1, 1, D], once per batch."""
        bias = torch.zeros_like(mask, dtype=torch.float32).masked_fill(~mask, float("-inf"))[:, None, None, :]
        if self.form == "additive":
            return self.w_g(structure), units, bias
        split = lambda x: x.view(*x.shape[:2], self.heads, -1).transpose(1, 2).contiguous()  # noqa: E731
        return split(self.k(structure)), split(self.v(units)), bias

    def forward(self, x: Tensor, keys: Tensor, values: Tensor, bias: Tensor) -> Tensor:
        """x [B, Q, H] -> out(c_struct) [B, Q, H]."""
        b, q, h = x.shape
        if self.form == "additive":
            e = self.score(torch.tanh(keys[:, None] + self.w_s(x)[:, :, None])).squeeze(-1)   # [B, Q, D]
            a = torch.softmax(e.float() + bias[:, 0], dim=-1)
            return self.out(a.to(values.dtype) @ values)
        qh = self.q(x).view(b, q, self.heads, -1).transpose(1, 2)                 # [B, h, Q, d]
        a = torch.softmax((qh @ keys.transpose(-1, -2)).float() * self.scale + bias, dim=-1)
        return self.out((a.to(values.dtype) @ values).transpose(1, 2).reshape(b, q, h))
