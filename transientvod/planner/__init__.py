"""Plan transient training clusters from the study's measurements: time, cost and failure."""
