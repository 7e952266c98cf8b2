"""Students: semi-supervised learners on the aggregator's labels, and the DP-SGD baseline."""
