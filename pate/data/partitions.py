"""The ways to deal the private rows among the teachers (``teachers.partition``), each with the
neighbouring datasets the privacy analysis then covers (docs/privacy-math.md, "Neighbouring
datasets"): the analysis assumes one teacher's rows differ between the two, and which change of
the data keeps the others' rows as they are depends on how the rows are dealt."""

# position: the figures cover changing one record; record: adding or removing one record;
# key: adding or removing one person's records (every row of one key).
PARTITIONS = ("position", "record", "key")


def counts_private(partition: str) -> bool:
    """Whether the number of private records, and each teacher's share of them, are private
    under ``partition``: dealt by record or key, the analysis covers adding or removing a
    record (or a person), which changes them, so they are said nowhere public (a report, an
    error line); dealt by position, a changed record leaves them as they are."""
    return partition != "position"


def partition_problem(partition: str, key: str | None) -> str | None:
    """Why dealing the rows by ``partition`` does not go with the key column ``key`` (the
    column of a CSV that names whose each row is), or None: a key is what ``key`` deals by, and
    is of no use to the others."""
    if partition == "key" and key is None:
        return ("dealing the rows by key needs the column that names whose each row is "
                "(data.key, --key)")
    if partition != "key" and key is not None:
        return (f"a key column (data.key, --key) is for dealing the rows by key (teachers."
                f"partition = \"key\", --partition key), not by {partition}")
    return None
