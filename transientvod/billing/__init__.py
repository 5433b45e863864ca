"""What a job's servers cost. Never imports torch, horovod or spot/ (the fleet imports this).

    prices.py   PriceCatalog: $/hour per type and market (the study's GCE prices, AWS
                on-demand tables, EC2's spot price history), PriceError
    meter.py    billed_seconds (the one billing rule), CostMeter -> Bill, $ per accuracy point
    budget.py   the fleet's budget rule, a pure function of dollars and hours
    job.py      JobBill: the hosts of a training job's ring -> the meter; price checks for the launcher

Import what you need from the modules; this file re-exports nothing, so that the planner or
the fleet importing billed_seconds loads no more than meter.py and prices.py.
"""
