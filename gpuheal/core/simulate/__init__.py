"""`gpuheal simulate`: a failure trace through the real policy and coordinator decisions.

run (the entry), engine (the fleet on a simulated clock), answer (gpuheal's answer to a report),
models (what it takes and gives), traces (failure traces: generated from published rates, or read).
"""
