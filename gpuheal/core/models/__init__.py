"""The wire models, by subject: every model here crosses a Temporal boundary (workflow input,
activity argument, query result) as a pydantic v2 model carried by the SDK's pydantic data converter.

base (names, vocabulary, the frozen base), report (a health report), incident (settings and
decisions), slurm (node and job actions), replacement (repair and replace), result (how an incident
ends), kubernetes (cordon, evict, borrow).
"""
