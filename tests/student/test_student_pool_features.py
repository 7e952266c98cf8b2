"""The cnn-hog-simclr student: its fixed pool features (HOG standardised on the pool beside the
frozen pool encoder), its saved weights, and where ``pate student train`` takes its encoder from
(``--pool-encoder``, the run's teachers, or one learnt from the pool), continuing only with the
same one."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.numpy import save_file
from student_support import one_thread, votes_for

from pate.cli.main import main
from pate.data.datasets import Dataset, public_split
from student.models import ModelSpec, PoolFeatures, build_classifier
from student.training import load_classifier, predict_proba, save_model, seed_everything
from teachers import checkpoints
from teachers.hog import hog_features, hog_size
from teachers.pool_encoder import FEATURES, FrozenEncoder, train_pool_encoder

pytestmark = pytest.mark.usefixtures(one_thread.__name__)

TRAIN = ["--method", "vat", "--arch", "cnn-hog-simclr", "--dataset", "digits", "--epochs", "1",
         "--budget-epsilon", "1e6", "--mechanism", "confident", "--threshold", "150",
         "--sigma1", "40", "--sigma2", "20"]


@pytest.fixture(scope="module")
def encoder(digits: Dataset) -> dict[str, np.ndarray]:
    """A pool encoder learnt briefly from digits' public pool."""
    return train_pool_encoder(public_split(digits)[0][0], 2, seed=0)


def test_features_are_standardised_hog_then_the_encoder(digits: Dataset,
        encoder: dict[str, np.ndarray]) -> None:
    (pool_x, _), (eval_x, _) = public_split(digits)
    features = PoolFeatures.on_pool(encoder, pool_x)
    assert not list(features.parameters())  # fixed: nothing here is trained
    x = torch.as_tensor(pool_x)
    f = features(x)
    n_hog = hog_size(pool_x.shape[1:])
    assert f.shape == (len(pool_x), PoolFeatures.size(pool_x.shape[1:])) == (
        len(pool_x), n_hog + FEATURES)
    hog = hog_features(x)
    torch.testing.assert_close(f[:, :n_hog].mean(0), torch.zeros(n_hog), atol=1e-4, rtol=0)
    # on the pool each HOG feature has standard deviation s / (s + 1e-3), s its own
    s = hog.std(0)
    torch.testing.assert_close(f[:, :n_hog].std(0), s / (s + 1e-3), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(f[:, n_hog:], FrozenEncoder(encoder)(x))
    # images beyond the pool are standardised with the pool's statistics, not their own
    e = features(torch.as_tensor(eval_x))[:, :n_hog]
    torch.testing.assert_close(e, (hog_features(torch.as_tensor(eval_x)) - hog.mean(0))
                               / (s + 1e-3), atol=1e-5, rtol=1e-5)


def test_build_needs_features_exactly_for_cnn_hog_simclr(digits: Dataset,
        encoder: dict[str, np.ndarray]) -> None:
    features = PoolFeatures.on_pool(encoder, public_split(digits)[0][0])
    with pytest.raises(ValueError, match="needs pool features"):
        build_classifier(ModelSpec("cnn-hog-simclr", (1, 8, 8), 10))
    with pytest.raises(ValueError, match="takes no pool features"):
        build_classifier(ModelSpec("cnn-hog", (1, 8, 8), 10), features)


def test_saved_student_is_rebuilt_with_its_features(tmp_path: Path, digits: Dataset,
                                                    encoder: dict[str, np.ndarray]) -> None:
    (pool_x, _), (eval_x, _) = public_split(digits)
    seed_everything(0)
    spec = ModelSpec("cnn-hog-simclr", pool_x.shape[1:], 10)
    model = build_classifier(spec, PoolFeatures.on_pool(encoder, pool_x))
    with torch.no_grad():  # a linear expert that is not at its initial values
        model.experts[1][1].weight.normal_()
    save_model(model, spec, tmp_path)
    loaded, loaded_spec = load_classifier(tmp_path)
    assert loaded_spec == spec
    np.testing.assert_array_equal(predict_proba(loaded, eval_x), predict_proba(model, eval_x))


def _run_dir(tmp_path: Path, digits: Dataset) -> Path:
    (_, pool_y), _ = public_split(digits)
    np.savez(tmp_path / "votes.npz", votes=votes_for(pool_y),
             pool_index=np.arange(len(pool_y), dtype=np.int64))
    return tmp_path


def _student_encoder(run: Path) -> dict[str, torch.Tensor]:
    model, _ = load_classifier(run / "student")
    return model.experts[1][0].encoder.state_dict()


def _same(a: dict[str, torch.Tensor], encoder: dict[str, np.ndarray]) -> bool:
    return all(torch.equal(a[k.replace(".", "_")], torch.as_tensor(v))
               for k, v in encoder.items())


def _metrics(run: Path) -> dict[str, object]:
    return json.loads((run / "student" / "metrics.json").read_text())


def _train(run: Path, *extra: str) -> int:
    return main(["student", "train", "--run", str(run), *TRAIN, *extra])


def test_student_takes_the_teachers_encoder_and_continues_only_with_it(
        tmp_path: Path, digits: Dataset, encoder: dict[str, np.ndarray],
        capsys: pytest.CaptureFixture) -> None:
    run = _run_dir(tmp_path, digits)
    sha = checkpoints.save_encoder(run, encoder)
    checkpoints.write_manifest(run, {"shards": {}, "pool_encoder": {"sha256": sha}})
    assert _train(run, "--queries", "60") == 0
    assert _metrics(run)["arch"] == "cnn-hog-simclr"
    assert _same(_student_encoder(run), encoder)

    # Another round continues from the saved student, as does naming the same encoder (saved
    # in float64: it is read as float32).
    assert _train(run, "--queries", "30") == 0
    assert _metrics(run)["continued_from_previous"]
    save_file({k: v.astype(np.float64) for k, v in encoder.items()},
              str(tmp_path / "same.safetensors"))
    assert _train(run, "--queries", "0", "--pool-encoder", str(tmp_path / "same.safetensors")
                  ) == 0
    assert _metrics(run)["continued_from_previous"]
    assert _same(_student_encoder(run), encoder)

    # A different encoder named on the command line is a different network: start afresh.
    other = train_pool_encoder(public_split(digits)[0][0], 1, seed=1)
    save_file(other, str(tmp_path / "other.safetensors"))
    assert _train(run, "--queries", "0", "--pool-encoder", str(tmp_path / "other.safetensors")
                  ) == 0
    assert not _metrics(run)["continued_from_previous"]
    assert _same(_student_encoder(run), other)

    # A file that is no encoder is one clear line before any query is asked: nothing is spent,
    # no label added, the saved student left alone.
    save_file({"w": np.zeros(3, np.float32)}, str(tmp_path / "bad.safetensors"))
    (tmp_path / "junk.safetensors").write_bytes(b"not safetensors")
    wrong = dict(other, **{"conv0.weight": np.full_like(other["conv0.weight"], np.nan)})
    save_file(wrong, str(tmp_path / "nan.safetensors"))
    labels, ledger = (run / "labels.npz").read_bytes(), (run / "ledger.db").read_bytes()
    capsys.readouterr()
    (tmp_path / "folder.safetensors").mkdir()  # safetensors: "No such device (os error 19)"
    for bad in ("bad", "junk", "nan", "missing", "folder"):
        assert _train(run, "--queries", "50", "--pool-encoder",
                      str(tmp_path / f"{bad}.safetensors")) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and f"--pool-encoder {tmp_path / bad}.safetensors" in err
        assert "os error" not in err
    assert (run / "labels.npz").read_bytes() == labels
    assert (run / "ledger.db").read_bytes() == ledger
    assert _same(_student_encoder(run), other)

    # The teachers' encoder damaged: fail closed before asking, too.
    path = run / "teachers" / checkpoints.ENCODER_FILE
    path.write_bytes(path.read_bytes()[:-8])
    assert _train(run, "--queries", "50") == 2
    assert "pool encoder" in capsys.readouterr().err
    assert (run / "labels.npz").read_bytes() == labels


def test_student_without_an_encoder_learns_one_from_the_pool_once(
        tmp_path: Path, digits: Dataset, encoder: dict[str, np.ndarray],
        capsys: pytest.CaptureFixture) -> None:
    run = _run_dir(tmp_path, digits)
    assert _train(run, "--queries", "60", "--encoder-epochs", "2") == 0
    assert "learning a pool encoder (2 SimCLR epochs on the 250 pool rows)" in (
        capsys.readouterr().err)
    # the same seed and epochs as the fixture's: the encoder depends on the public pool alone
    assert _same(_student_encoder(run), encoder)
    # the next round keeps the saved student's encoder rather than learning another
    assert _train(run, "--queries", "30", "--width", "16") == 0
    assert "learning a pool encoder" not in capsys.readouterr().err
    assert _same(_student_encoder(run), encoder)
    assert not _metrics(run)["continued_from_previous"]  # another width: a new network


@pytest.mark.parametrize("extra", [
    ["--arch", "cnn", "--encoder-epochs", "2"],
    ["--pool-encoder", "x.safetensors", "--encoder-epochs", "2"]])
def test_encoder_options_only_where_they_apply(tmp_path: Path, digits: Dataset,
                                               extra: list[str],
                                               capsys: pytest.CaptureFixture) -> None:
    run = _run_dir(tmp_path, digits)
    assert _train(run, "--queries", "10", *extra) == 2
    assert "--encoder-epochs" in capsys.readouterr().err
    assert not (run / "labels.npz").exists()
