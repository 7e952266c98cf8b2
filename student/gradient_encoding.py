"""The per-step operations of DP-SGD with gradient encoding (Nasr, Shokri, Houmansadr 2020,
"Improving Deep Learning with Differential Privacy using Gradient Encoding and Denoising"): the
encoder (Algorithm 2), plain clipping, and the noise of any family (Algorithm 1). Batched: one
sort and one matrix product per chunk of examples, no loop over examples or coordinates."""

from __future__ import annotations

import numpy as np
import torch

from analysis.noise_families import NoiseFamily

_ROWS_PER_CHUNK = 512


def float32_profiles(profiles: np.ndarray) -> torch.Tensor:
    """The float64 profiles as float32, each value rounded towards zero, so that an encoded
    coordinate never exceeds the value the accountant rounds up."""
    p32 = profiles.astype(np.float32)
    p32 = np.where(p32 > profiles, np.nextafter(p32, np.float32(0.0)), p32)
    return torch.from_numpy(np.ascontiguousarray(p32))


def encode(grads: torch.Tensor, profiles: torch.Tensor) -> torch.Tensor:
    """Encode each row of ``grads`` [examples, d] (Algorithm 2): order its coordinates by
    magnitude, descending, choose the profile (rows of ``profiles`` [members, d], unit norm,
    sorted descending) of largest cosine similarity with the ordered magnitudes, and clip the
    coordinate at position t to [-psi[t], psi[t]]. Every row returned is dominated by its
    profile under a permutation, so its norm is at most the profile's.

    The order is a radix sort (numpy's stable sort of 16-bit keys) of the magnitudes' upper 16
    bits (bfloat16 precision): coordinates within 2^-8 of each other in relative magnitude keep
    their index order. Domination holds for any order, so privacy does not depend on it."""
    out = np.empty(grads.shape, np.float32)
    for start in range(0, grads.shape[0], _ROWS_PER_CHUNK):
        g = grads[start:start + _ROWS_PER_CHUNK].detach().numpy()
        key = (np.abs(g).view(np.uint32) >> 16).astype(np.uint16)
        order = np.argsort(key, axis=1, kind="stable")[:, ::-1]
        signed = np.take_along_axis(g, order, axis=1)
        magnitude = torch.from_numpy(np.abs(signed))
        # Profiles have unit norm and the magnitudes a fixed norm per row: the largest dot
        # product is the largest cosine similarity.
        chosen = profiles[(magnitude @ profiles.T).argmax(dim=1)].numpy()
        np.put_along_axis(out[start:start + len(g)], order, np.clip(signed, -chosen, chosen),
                          axis=1)
    return torch.from_numpy(out)


def clip_flat(grads: torch.Tensor, max_norm: float) -> torch.Tensor:
    """Plain DP-SGD's per-example clipping, with Opacus's factor min(1, C / (norm + 1e-6))."""
    norms = grads.norm(dim=1, keepdim=True)
    return grads * (max_norm / (norms + 1e-6)).clamp(max=1.0)


def draw_noise(family: NoiseFamily, std: float, size: int,
               generator: torch.Generator) -> torch.Tensor:
    """``size`` i.i.d. draws of the family at standard deviation ``std`` (float32), by the
    quantile function of uniforms (j + 1/2) / 2^53 from ``generator`` (an OS-seeded one:
    ``student.dpsgd.secure_generator``); the grid is symmetric about 1/2, so the draws are too."""
    u = torch.rand(size, dtype=torch.float64, generator=generator).numpy() + 2.0 ** -54
    return torch.from_numpy(std * family.ppf(u)).to(torch.float32)
