"""The per-step operations of DP-SGD with gradient encoding (Nasr, Shokri, Houmansadr 2020,
"Improving Deep Learning with Differential Privacy using Gradient Encoding and Denoising"): the
encoder (Algorithm 2), plain clipping, and the noise of any family (Algorithm 1). Batched: per
chunk of examples one sort, one pruned product against the profiles and one scatter, no loop
over examples or coordinates."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
import torch.nn.functional as F

from analysis.noise_families import NoiseFamily

_ROWS_PER_CHUNK = 512
_BLOCK = 16


class ProfileChooser:
    """The exact ``argmax_j <m, psi_j>`` for magnitudes m sorted in descending order over the
    profiles psi_j, in about a third of the full product's time on our gradients.

    Write psi_j = mean + r_j and cut the coordinates into blocks of ``block`` (the last one
    shorter). On a block B of n_B coordinates, <m_B, r_jB> = sum(m_B) * mean(r_jB) + <m_B -
    mean(m_B), r_jB - mean(r_jB)>; the second term is at most ||m_B - mean(m_B)|| * ||r_jB -
    mean(r_jB)|| in absolute value (Cauchy-Schwarz), small where m and r_j are smooth (m sorted;
    the bound does not need the sort to be exact, as the encoder's 16-bit keys leave it). Summed
    over blocks, products of [rows, blocks] by [blocks, members] bound every <m, r_j> from below
    and above, with room for float32 rounding; a profile whose upper bound is below another's
    lower bound cannot be the best, and the survivors (a few dozen per row) get the exact
    product. Which profile is chosen does not affect privacy (every profile is accounted
    for)."""

    def __init__(self, profiles: torch.Tensor, block: int = _BLOCK) -> None:
        members, d = profiles.shape
        self.profiles, self.block, self.d = profiles, block, d
        starts = torch.arange(0, d, block)
        self.lengths = torch.diff(starts, append=torch.tensor([d])).to(profiles.dtype)
        pad = (-d) % block
        resid = (profiles - profiles.mean(0)).double()
        r = F.pad(resid, (0, pad)).reshape(members, -1, block)
        centre = r.sum(2) / self.lengths.double()
        squares = ((r - centre[..., None]) ** 2).sum(2)
        squares[:, -1] -= pad * centre[:, -1] ** 2  # the padded zeros are not coordinates
        spread = squares.clamp(min=0).sqrt().to(profiles.dtype)
        centre = centre.to(profiles.dtype)
        self.block_means = centre.T.contiguous()  # [blocks, members]
        self.block_spreads = spread.T.contiguous()
        self.largest_mean = self.block_means.abs().max(0).values  # [members]

    def __call__(self, magnitudes: torch.Tensor) -> torch.Tensor:
        """The index of the chosen profile for each row of ``magnitudes`` [rows, d], each row
        sorted in descending order."""
        magnitudes = magnitudes.contiguous()
        rows, d, block = len(magnitudes), self.d, self.block
        full = d // block
        body = magnitudes.as_strided((rows, full, block), (magnitudes.stride(0), block, 1))
        sums = body.sum(2)
        spreads = torch.linalg.vector_norm(body - (sums / block)[..., None], dim=2)
        if d % block:
            tail = magnitudes[:, full * block:]
            sums = torch.cat([sums, tail.sum(1, keepdim=True)], 1)
            spreads = torch.cat([spreads, torch.linalg.vector_norm(
                tail - sums[:, -1:] / tail.shape[1], dim=1, keepdim=True)], 1)
        spreads += 4 * 2.0 ** -24 * sums  # their float32 rounding: ||m_B|| <= sum(m_B)
        estimate = sums @ self.block_means
        radius = spreads @ self.block_spreads
        # float32 rounding: at most (terms + 2) * 2^-24 of the sums of the terms' magnitudes,
        # sum_B sums_B * |mean_jB| <= sum(m) * max_B |mean_jB| for the first product
        radius += (len(self.lengths) + 2) * 2.0 ** -24 * (
            sums.sum(1, keepdim=True) * self.largest_mean + radius)
        floor = (estimate - radius).max(1, keepdim=True).values
        survivors = ((estimate + radius) >= floor).any(0).nonzero().flatten()
        exact = magnitudes @ self.profiles[survivors].T
        return survivors[exact.argmax(1)]


def float32_profiles(profiles: np.ndarray, scale: float = 1.0) -> torch.Tensor:
    """The float64 profiles times ``scale`` (the clipping norm C) as float32, each value rounded
    towards zero, so that an encoded coordinate never exceeds the value the accountant rounds
    up."""
    profiles = profiles * scale
    p32 = profiles.astype(np.float32)
    p32 = np.where(p32 > profiles, np.nextafter(p32, np.float32(0.0)), p32)
    return torch.from_numpy(np.ascontiguousarray(p32))


def encode(grads: torch.Tensor, profiles: torch.Tensor | ProfileChooser,
           workers: int = 2) -> torch.Tensor:
    """Encode each row of ``grads`` [examples, d] (Algorithm 2): order its coordinates by
    magnitude, descending, choose the profile (rows of ``profiles`` [members, d], of equal norm,
    sorted descending) of largest cosine similarity with the ordered magnitudes, and clip the
    coordinate at position t to [-psi[t], psi[t]]. Every row returned is dominated by its
    profile under a permutation, so its norm is at most the profile's.

    The order is a radix sort (numpy's stable sort of 16-bit keys) of the magnitudes' upper 16
    bits (bfloat16 precision): coordinates within 2^-8 of each other in relative magnitude keep
    their index order. Domination holds for any order, so privacy does not depend on it.
    ``workers`` threads sort as many chunks of rows at once (numpy releases the GIL); then
    torch's threads gather, choose (:class:`ProfileChooser`; pass one to reuse it across steps),
    clip and scatter back each of them."""
    choose = profiles if isinstance(profiles, ProfileChooser) else ProfileChooser(profiles)
    g_all = grads.detach().contiguous()
    out = torch.empty_like(g_all)
    chunks = [slice(s, s + _ROWS_PER_CHUNK) for s in range(0, len(g_all), _ROWS_PER_CHUNK)]

    def descending_order(rows: slice) -> torch.Tensor:
        top_bits = (g_all[rows].numpy().view(np.uint32) >> 16).astype(np.uint16)
        key = np.uint16(0x7FFF) - (top_bits & np.uint16(0x7FFF))  # |g| large: key small
        return torch.from_numpy(np.argsort(key, axis=1, kind="stable"))

    with ThreadPoolExecutor(workers) as pool:
        for first in range(0, len(chunks), workers):
            group = chunks[first:first + workers]
            for rows, order in zip(group, pool.map(descending_order, group), strict=True):
                signed = torch.gather(g_all[rows], 1, order)
                magnitude = signed.abs()
                # Profiles have equal norms and the magnitudes a fixed norm per row: the largest
                # dot product is the largest cosine similarity.
                chosen = choose.profiles[choose(magnitude)]
                torch.minimum(magnitude, chosen, out=magnitude).copysign_(signed)
                out[rows].scatter_(1, order, magnitude)
    return out


def clip_factors(norms: torch.Tensor, max_norm: float) -> torch.Tensor:
    """Opacus's per-example clipping factors min(1, C / (norm + 1e-6))
    (``opacus.optimizers.optimizer``)."""
    return (max_norm / (norms + 1e-6)).clamp(max=1.0)


def clip_flat(grads: torch.Tensor, max_norm: float) -> torch.Tensor:
    """Plain DP-SGD's per-example clipping of the rows of ``grads`` (:func:`clip_factors`)."""
    return grads * clip_factors(grads.norm(dim=1, keepdim=True), max_norm)


def draw_noise(family: NoiseFamily, std: float, size: int,
               generator: torch.Generator) -> torch.Tensor:
    """``size`` i.i.d. draws of the family at standard deviation ``std`` (float32), by the
    quantile function of uniforms (j + 1/2) / 2^53 from ``generator`` (an OS-seeded one:
    ``student.dpsgd.secure_generator``); the grid is symmetric about 1/2, so the draws are too."""
    u = torch.rand(size, dtype=torch.float64, generator=generator).numpy() + 2.0 ** -54
    return torch.from_numpy(std * family.ppf(u)).to(torch.float32)
