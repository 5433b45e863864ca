"""Where spot lifecycles come from: the provider interface and its sources (a replayed trace,
AWS EC2, Compute Engine), and the one place that builds the provider a config names."""
