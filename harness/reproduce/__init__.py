"""`lossbed reproduce`: the two papers' claims measured here, each with a verdict.

    loopback.py     n ranks in one process over UDP on 127.0.0.1 (the real collective)
    aggregation.py  row 1: unbiased aggregation, per element and by Monte Carlo
    drift.py        row 2: bounded drift of parameter broadcasts, and its control
    rps_scaling.py  row 3: RPS, the harm of a drop rate shrinks as servers are added
    training.py     rows 4-5: perplexity against the loss rate, and the variants at 10%
    report.py       runs the rows, writes reproduction.md and reproduction.json
The verdict (measured ± interval against a prediction and its tolerance) is the bench's too:
harness/metrics/verdict.py.
"""
