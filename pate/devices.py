"""Whether a torch device named by the user can run here, checked at the edge (flags, config)
so that a run on a machine without it stops in one line instead of failing or hanging later."""

from __future__ import annotations


def device_problem(name: str) -> str | None:
    """None when ``name`` (``cpu``, ``cuda``, ``cuda:N``, ``mps``) is a device this machine has,
    else why not. ``cpu`` is answered without importing torch."""
    if name == "cpu":
        return None
    import torch

    try:
        device = torch.device(name)
    except (RuntimeError, ValueError):
        return f"{name!r} is not a torch device (cpu, cuda, cuda:N)"
    if device.type == "cuda":
        if not torch.cuda.is_available():
            return f"device {name!r}: this machine has no CUDA GPU that torch can use"
        if device.index is not None and device.index >= torch.cuda.device_count():
            return (f"device {name!r}: this machine has {torch.cuda.device_count()} CUDA "
                    "GPU(s)")
        return None
    if device.type == "mps" and not torch.backends.mps.is_available():
        return f"device {name!r}: this machine has no MPS device"
    if device.type not in ("cpu", "cuda", "mps"):
        return f"device {name!r}: only cpu, cuda and mps are supported"
    return None
