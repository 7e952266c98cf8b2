"""Teacher architectures and their seeded, group-independent initialisation.

The networks are ordinary ``torch.nn`` modules; :mod:`teachers.ensemble` trains K of them at once
by stacking their parameters and mapping the module over the stack with ``torch.func.vmap`` and
``functional_call`` (https://pytorch.org/docs/stable/func.html, "model ensembling"). So that vmap
applies, no layer keeps running statistics or draws random numbers in ``forward``: the residual
option normalises with GroupNorm (Y. Wu, K. He, "Group Normalization", ECCV 2018), not BatchNorm.
A fixed map that every path starts with (HOG, scattering) runs outside vmap, and only the head
is mapped (:func:`on_features`, :mod:`teachers.fixed_maps`).

- ``cnn``: a small strided CNN for 28x28 (and smaller) inputs, cheap enough to train hundreds of
  teachers on two CPU cores.
- ``cnn-pool``: 3x3 convolutions at full resolution, each followed by 2x2 max-pooling (the
  VGG pattern: K. Simonyan, A. Zisserman, ICLR 2015), 16 then 32 channels: about three times the
  cost of ``cnn`` and better with a few hundred examples per teacher (Fashion-MNIST, 25 teachers
  of 240 examples: mean accuracy 0.772 against 0.757, plurality on the pool 0.834 against 0.824).
- ``resnet``: a deeper residual network (K. He et al., "Deep Residual Learning for Image
  Recognition", CVPR 2016) for harder data such as SVHN or CIFAR-10.
- ``mlp``: one hidden layer, the cheapest option.
- ``cnn-pool-hog``: two experts on the same rows, ``cnn-pool`` and a linear softmax on fixed
  histograms of oriented gradients (:mod:`teachers.hog`). Each expert is trained on its own
  cross-entropy; the teacher predicts with the mean of their softmax outputs. Their errors differ,
  so the pair is better than either (Fashion-MNIST, 25 teachers of 240 examples, mixup 0.4: mean
  accuracy 0.802 and pool plurality 0.847, against 0.775 and 0.832 for ``cnn-pool`` and 0.792
  and 0.834 for the HOG expert alone).
- ``scatter``: a linear softmax on fixed wavelet scattering features (:mod:`teachers.scattering`,
  the features of Tramer and Boneh's DP-SGD recipe).
- ``hog-scatter``: the HOG and scattering linear experts on the same rows, as ``cnn-pool-hog``
  pairs two. Every path of ``hog``, ``scatter`` and ``hog-scatter`` starts with a fixed map, so
  the trainer and the vote compute the maps outside vmap, once per row where the rows are not
  shifted or mixed (:func:`on_features`).
- ``hog-scatter-whitened``: ``hog-scatter`` with each map's features whitened on the public
  pool (:mod:`teachers.whitening`, the run's pool encoder of that kind): fitted once per run,
  shared by all teachers (Fashion-MNIST, 250 teachers of about 240 rows: mean accuracy 0.784 and
  a plurality of 0.877 on the evaluation half, against 0.771 and 0.851 for ``hog-scatter``).
- ``cnn-pool-hog-simclr``: a third expert, a linear softmax on the run's pool encoder
  (:mod:`teachers.pool_encoder`, SimCLR on the public pool, frozen): features learnt from
  thousands of unlabelled public images rather than the teacher's few hundred private ones
  (Fashion-MNIST, 250 teachers: mean accuracy 0.814 and pool plurality 0.864, against 0.803 and
  0.850 for ``cnn-pool-hog``).

A user's own network is named by its import path ``package.module:factory`` instead
(:mod:`teachers.user_models`); :func:`build_model` and :func:`initial_state` take either.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch
from torch import nn

from pate.errors import UserError
from teachers import rng
from teachers.choices import (
    MODEL_RECORDS,
    POOL_ENCODER_MODELS,
    SIMCLR,
    is_import_path,
    model_name_problem,
)
from teachers.fixed_maps import Columns, FixedMap, Pixels
from teachers.hog import HOG, hog_size
from teachers.pool_encoder import EPOCHS, FEATURES, FrozenEncoder, train_pool_encoder
from teachers.scattering import Scattering, scattering_size
from teachers.user_models import build_user_model, check_trains_on, teacher_states
from teachers.whitening import MAPS, Whitened, fit_whitening

Shape = tuple[int, int, int]


def _cnn(in_shape: Shape, num_classes: int) -> nn.Module:
    c, h, w = in_shape
    feat = 32 * math.ceil(h / 4) * math.ceil(w / 4)
    return nn.Sequential(
        nn.Conv2d(c, 16, 5, stride=2, padding=2), nn.ReLU(),
        nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU(),
        nn.Flatten(), nn.Linear(feat, num_classes))


def _cnn_pool(in_shape: Shape, num_classes: int) -> nn.Module:
    c, h, w = in_shape
    feat = 32 * (h // 4) * (w // 4)
    return nn.Sequential(
        nn.Conv2d(c, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(feat, num_classes))


class _Block(nn.Module):
    """Pre-activation residual block: GN-ReLU-conv-GN-ReLU-conv plus a (projected) shortcut."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.n1 = nn.GroupNorm(min(8, cin), cin)
        self.c1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1)
        self.n2 = nn.GroupNorm(min(8, cout), cout)
        self.c2 = nn.Conv2d(cout, cout, 3, padding=1)
        self.skip = (nn.Conv2d(cin, cout, 1, stride=stride)
                     if stride != 1 or cin != cout else nn.Identity())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.n1(x))
        return self.skip(x) + self.c2(torch.relu(self.n2(self.c1(h))))


def _resnet(in_shape: Shape, num_classes: int) -> nn.Module:
    c = in_shape[0]
    return nn.Sequential(
        nn.Conv2d(c, 16, 3, padding=1),
        _Block(16, 16, 1), _Block(16, 32, 2), _Block(32, 64, 2),
        nn.GroupNorm(8, 64), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        nn.Linear(64, num_classes))


def _mlp(in_shape: Shape, num_classes: int) -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(int(np.prod(in_shape)), 128), nn.ReLU(),
                         nn.Linear(128, num_classes))


class Experts(nn.Module):
    """Independent experts that see the same input. In training mode ``forward`` returns their
    logits ``[n, E, C]`` (the training loss gives each expert its own cross-entropy: the
    teachers', and the ``cnn-hog`` student's); in eval mode the log of the mean of their softmax
    outputs ``[n, C]``, the averaged-probability ensemble (T. G. Dietterich, "Ensemble Methods in
    Machine Learning", MCS 2000)."""

    def __init__(self, *experts: nn.Module) -> None:
        super().__init__()
        self.experts = nn.ModuleList(experts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = torch.stack([e(x) for e in self.experts], -2)
        if self.training:
            return logits
        return torch.logsumexp(logits.log_softmax(-1), -2) - math.log(len(self.experts))


def hog_linear(in_shape: Shape, num_classes: int) -> nn.Module:
    """The HOG expert: a linear softmax on :func:`teachers.hog.hog_features`."""
    return nn.Sequential(HOG(), nn.Linear(hog_size(in_shape), num_classes))


def scatter_linear(in_shape: Shape, num_classes: int) -> nn.Module:
    """The scattering expert: a linear softmax on :class:`teachers.scattering.Scattering`."""
    return nn.Sequential(Scattering(in_shape), nn.Linear(scattering_size(in_shape), num_classes))


def _hog_scatter(in_shape: Shape, num_classes: int) -> nn.Module:
    return Experts(hog_linear(in_shape, num_classes), scatter_linear(in_shape, num_classes))


def _hog_scatter_whitened(in_shape: Shape, num_classes: int,
                          encoder: dict[str, torch.Tensor]) -> nn.Module:
    maps = [Whitened(name, in_shape, encoder) for name in MAPS]
    return Experts(*(nn.Sequential(m, nn.Linear(m.width, num_classes)) for m in maps))


def _cnn_pool_hog(in_shape: Shape, num_classes: int) -> nn.Module:
    return Experts(_cnn_pool(in_shape, num_classes), hog_linear(in_shape, num_classes))


def _cnn_pool_hog_simclr(in_shape: Shape, num_classes: int,
                         encoder: dict[str, torch.Tensor]) -> nn.Module:
    return Experts(_cnn_pool(in_shape, num_classes), hog_linear(in_shape, num_classes),
                   nn.Sequential(FrozenEncoder(encoder), nn.Linear(FEATURES, num_classes)))


ARCHITECTURES: dict[str, Callable[..., nn.Module]] = {
    "cnn": _cnn, "cnn-pool": _cnn_pool, "resnet": _resnet, "mlp": _mlp, "hog": hog_linear,
    "scatter": scatter_linear, "hog-scatter": _hog_scatter,
    "hog-scatter-whitened": _hog_scatter_whitened, "cnn-pool-hog": _cnn_pool_hog,
    "cnn-pool-hog-simclr": _cnn_pool_hog_simclr}


def fit_pool_encoder(name: str, pool_x: np.ndarray, seed: int, device: str = "cpu",
                     epochs: int = EPOCHS) -> dict[str, np.ndarray]:
    """The frozen pool encoder architecture ``name`` (one of :data:`POOL_ENCODER_MODELS`)
    reads, fitted on the public pool ``pool_x`` alone: SimCLR for ``epochs`` epochs
    (:func:`teachers.pool_encoder.train_pool_encoder`, on ``device``, seeded by ``seed``), or
    the whitening of its fixed maps (:func:`teachers.whitening.fit_whitening`, deterministic)."""
    if MODEL_RECORDS[name].pool_encoder == SIMCLR:
        return train_pool_encoder(pool_x, epochs, seed, device)
    return fit_whitening(pool_x)


def build_model(name: str, in_shape: Shape, num_classes: int,
                encoder: dict[str, torch.Tensor] | None = None) -> nn.Module:
    """A fresh module of architecture ``name`` (a built-in or an import path) for inputs
    ``[C, H, W]``, in training mode (call ``.eval()`` before predicting: :class:`Experts`
    answers differently). Architectures in :data:`POOL_ENCODER_MODELS` need the run's
    ``encoder`` tensors, the others take none."""
    problem = model_name_problem(name, tuple(ARCHITECTURES))
    if problem:
        raise UserError(f"model {problem}")
    if (name in POOL_ENCODER_MODELS) != (encoder is not None):
        raise UserError(f"model {name} {'needs' if encoder is None else 'takes no'} pool encoder")
    if is_import_path(name):
        return build_user_model(name, in_shape, num_classes)
    extra = (encoder,) if encoder is not None else ()
    return ARCHITECTURES[name](tuple(in_shape), num_classes, *extra)


def on_features(model: nn.Module, in_shape: Shape, inputs: bool = False
                ) -> tuple[nn.Module, list[FixedMap]] | None:
    """``(head, maps)`` where every path of ``model`` (a built-in's, for inputs ``[C, H, W]``)
    starts with a :class:`~teachers.fixed_maps.FixedMap`: ``head`` is ``model`` with each map
    replaced by the :class:`~teachers.fixed_maps.Columns` of its output in a table of the
    ``maps``' outputs (:func:`teachers.fixed_maps.feature_table`), its parameters named as
    ``model``'s, so a teacher's state fits either. None where a path reads the input itself
    (``cnn-pool-hog``'s convolutions), unless ``inputs``: then such a path reads the input's
    own columns (a :class:`~teachers.fixed_maps.Pixels` map among ``maps``), shaped back to
    ``in_shape``, and ``head``, whose parameters are ``model``'s own objects under other names,
    trains ``model`` itself."""
    maps: list[FixedMap] = []
    columns: list[Columns] = []
    read_input: list[Columns] = []  # the input's own columns, shared by the paths that read it

    def table_columns(module: FixedMap) -> Columns:
        device = next(module.buffers(), torch.zeros(0)).device
        with torch.no_grad():
            width = module(torch.zeros((1, *in_shape), device=device)).shape[1]
        start = sum(c.stop - c.start for c in columns)
        columns.append(Columns(start, start + width))
        maps.append(module)
        return columns[-1]

    def head_of(module: nn.Module) -> nn.Module | None:
        if isinstance(module, FixedMap):
            return table_columns(module)
        # exact types: a subclass (a user's) may have a forward of its own, not rebuilt here
        if type(module) is nn.Sequential and len(module):
            first = head_of(module[0])
            if first is not None:
                return nn.Sequential(first, *list(module)[1:])
        if type(module) is Experts:
            heads = [head_of(e) for e in module.experts]
            return None if any(h is None for h in heads) else Experts(*heads)
        if inputs:
            read_input[:] = read_input or [table_columns(Pixels())]
            return nn.Sequential(read_input[0], nn.Unflatten(1, tuple(in_shape)), module)
        return None

    head = head_of(model)
    return None if head is None else (head.train(model.training), maps)


def check_user_model(name: str, in_shape: Shape, num_classes: int,
                     batch_size: int) -> nn.Module | None:
    """Build a user's network (``name`` an import path) once and probe it
    (:func:`teachers.user_models.build_user_model`, and ``check_trains_on`` at batches of
    ``batch_size``): a factory that fails, a network of the wrong output, or one that cannot
    train on batches that small, fails here, before any file of the run is written. Returns
    the network probed (its layers as the factory builds them; its weights moved by the
    probe), None for a built-in, which needs no check."""
    if not is_import_path(name):
        return None
    model = build_user_model(name, in_shape, num_classes)
    check_trains_on(model, batch_size, in_shape, f"model {name!r}")
    return model


def initial_state(name: str, model: nn.Module, in_shape: Shape, num_classes: int,
                  teacher_ids: np.ndarray, seed: int) -> dict[str, torch.Tensor]:
    """The initial state of the teachers ``teacher_ids`` of architecture ``name`` (``model``
    is one built by :func:`build_model`), stacked on a leading axis: a built-in's parameters
    (:func:`init_stacked`); a user's network's parameters and buffers, from its own
    initialisation run once per teacher under a generator seeded from (seed, teacher)
    (:func:`teachers.user_models.teacher_states`). Either way teacher ``t``'s state depends
    only on (seed, t)."""
    if is_import_path(name):
        return teacher_states(name, in_shape, num_classes, teacher_ids, seed)
    return init_stacked(model, teacher_ids, seed)


def init_stacked(model: nn.Module, teacher_ids: np.ndarray, seed: int
                 ) -> dict[str, torch.Tensor]:
    """Initial parameters of the teachers ``teacher_ids``, stacked on a leading axis.

    Convolution and linear weights and biases are uniform in ±1/sqrt(fan_in), PyTorch's default
    (``kaiming_uniform_(a=sqrt(5))``); GroupNorm starts at scale 1, shift 0. Teacher ``t``'s
    numbers depend only on (seed, t), never on the rest of its group. These are the built-in
    models' layers; a parameter of any other layer is refused (ValueError): a user's network
    initialises itself (:func:`initial_state`).
    """
    ids = np.asarray(teacher_ids, dtype=np.int64)
    out: dict[str, torch.Tensor] = {}
    for index, (name, p) in enumerate(model.named_parameters()):
        owner = model.get_submodule(name.rpartition(".")[0])
        shape = (len(ids), *p.shape)
        if isinstance(owner, nn.GroupNorm):
            value = np.full(shape, 1.0 if name.endswith("weight") else 0.0)
        elif not isinstance(owner, nn.Linear | nn.modules.conv._ConvNd):
            raise ValueError(f"no initialisation rule for {name} of a "
                             f"{type(owner).__name__}")
        else:
            weight = owner.weight
            bound = 1.0 / math.sqrt(weight[0].numel())
            u = rng.uniform(seed, ids, rng.INIT, np.full((1, 1), index),
                            np.arange(p.numel())[None])
            value = ((2.0 * u - 1.0) * bound).reshape(shape)
        out[name] = torch.as_tensor(value, dtype=torch.float32)
    return out
