"""Objects that hold private data print without it: a notebook's echo or a log line of one
shows its public parts only (docs/design.md, privacy rule 2)."""

from __future__ import annotations

import numpy as np
import torch

from analysis.mechanisms import GNMax
from analysis.votes_analysis import QuerySegment
from pate.aggregation.aggregators import Aggregator
from student.dpsgd import DPSGDResult
from teachers.partition import Partition


def test_private_fields_are_left_out_of_the_printed_objects() -> None:
    votes = np.array([[7391, 17, 3], [15, 7402, 1]])
    segment = QuerySegment(votes, GNMax(sigma=5.0))
    assert "7391" not in repr(segment) and "votes" not in repr(segment)
    answers = Aggregator(GNMax(sigma=5.0)).answer(votes)
    assert "labels=" in repr(answers) and "dependent=" not in repr(answers).replace(
        "independent=", "")
    dealt = Partition(seed=1, num_teachers=3, assignment=np.array([2, 0, 1, 1]), by="record")
    assert repr(dealt) == "Partition(seed=1, num_teachers=3, by='record')"
    result = DPSGDResult({"epsilon_bayesian": 0.731}, torch.nn.Linear(2, 2),
                         np.array([[0.6180339]]))
    assert "0.731" not in repr(result) and "0.618" not in repr(result)
    assert "Linear" in repr(result)
