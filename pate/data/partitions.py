"""The ways to deal the private rows among the teachers (``teachers.partition``), each with the
neighbouring datasets the privacy analysis then covers (docs/privacy-math.md, "Neighbouring
datasets"): the analysis assumes one teacher's rows differ between the two, and which change of
the data keeps the others' rows as they are depends on how the rows are dealt."""

PARTITIONS = {"position": "changing one record", "record": "adding or removing one record"}
