"""The chaos soak (`make soak`, issue 37): failures and faults together, for a long time, across
two clusters, then a checker that reads what the systems recorded, never gpuheal's own claims.

Layers, each importing only those below it:
- `records`: what Slurm, Temporal and the sandbox wrote, as plain values, and the parsers of
  their real formats (slurmctld's log, the provider's spare record, Slurm sampled each second);
- `invariants`: the checks, pure functions of those records, each finding named violations;
- the world, the load and the faults that produce the records (next: issue 37's harness).
"""
