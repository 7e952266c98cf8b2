"""PATE from Python, on numpy arrays in memory, in the words of scikit-learn and Opacus.

``Teachers`` are fitted on the private data (disjoint partitions, trained vectorised in this
process), ``PrivateLabels`` answers the student's queries with a PATE mechanism against a
privacy budget, charging the same durable ledger as ``pate serve`` (no HTTP), ``Student`` learns
from the public pool and the answers, and ``PrivateLabels.epsilon`` gives the epsilons you may
publish; ``DPSGD`` (:mod:`pate.api_dpsgd`) is the baseline to compare the student with at
the same epsilon. ``load_student`` reads back the student of a ``pate run`` directory (or of
``Student.save``); such a student also scores raw files (``Student.predict_file``);
``load_dpsgd`` reads back the DP-SGD model of a run (``pate dpsgd train``, ``pate run``). The
README's example is run by the test suite (``tests/test_api.py``).

Feature rows are used as given, unscaled (``pate run`` on a CSV file scales them for you):
standardise them first, with statistics of public rows (the pool), never of the private ones,
whose mean and spread would be a statistic of the private data; ``TableEncoder``
(:mod:`pate.api_tables`) does it for data frames as ``pate run`` does for a CSV file. Integer
images are 8-bit pixels, divided by 255 (give another range as floats in [0, 1]).

Privacy: the votes, the ledger and the private arrays stay private; publish the student and
``PrivateLabels.epsilon().to_quote`` (docs/design.md; docs/privacy-math.md §12 says what each
epsilon rests on). A failure while training on private rows names its exception's class only
(its message may quote a row); ``PATE_TRACEBACK=1`` in the environment shows it whole.

PATE 2018's Table 2 analysis of votes in memory (private: the data-dependent figures are not
for publication): ``np.save(folder / "votes.npy", votes)`` into a folder only you can read
(``chmod 700``; the votes are private), then ``pate analyze --votes .../votes.npy --delta D
--mechanism M ...``. The HTML report is ``pate run``'s.

Speed: training runs in this process on torch's threads; ``torch.set_num_threads(n)`` sets
them as the commands' ``--threads`` does (1 is often fastest on a busy machine). Nothing here
prints progress.

Errors: every error raised on purpose is a :class:`pate.errors.PateError` with a one-line
message: ``UserError`` for input you can fix, ``BudgetExhausted`` where the budget cannot cover
a request (nothing was asked or spent), ``LedgerError`` where the ledger cannot be opened or
trusted (nothing released). Catch ``PateError`` for all of them. The mechanisms you build
from :mod:`analysis.mechanisms` (the math layer, below ``pate``) refuse bad parameters as they
are built, with ``analysis.mechanisms.ParameterError``, a ``ValueError``.
"""

from pate.api_dpsgd import DPSGD, load_dpsgd
from pate.api_labels import PrivateLabels, PublishableEpsilon
from pate.api_student import Student, load_student
from pate.api_tables import TableEncoder
from pate.api_teachers import Teachers

__all__ = ["DPSGD", "PrivateLabels", "PublishableEpsilon", "Student", "TableEncoder", "Teachers",
           "load_dpsgd", "load_student"]
