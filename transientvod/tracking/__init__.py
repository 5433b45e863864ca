"""MLflow: every run's params, metrics by step, cost, figure and summary, for comparison in
MLflow's UI and with `transientvod compare`. Never imports torch or horovod, nor the training
side (worker/, gradients/, head/, cli): they import this.

    store.py    the one MLflow store helper: which store (default <output_dir>/mlflow.db), what a
                sqlite: URI names, the fail-fast MlflowClient, the write and read checks,
                TrackingError
    run.py      a job's run: open (launcher) and close, params, tags, final metrics
    sender.py   MetricSender (rank 0's background thread) and resend_unsent
    head_server.py  StoreServer: `mlflow server` on the head for the job's SQLite store, so that
                workers on hosts with no shared disk can log to it by URL
    figure.py   the cost-versus-accuracy PNG of one run, logged to the run
    names.py    every param, tag, metric and artifact name, for writers and readers
    compare.py  `transientvod compare`: the study's table, CSV and scatter from the store

Import what you need from the modules; this file re-exports nothing, so that a worker that
needs TrackingError or the sender loads neither matplotlib nor the run's code.
"""
