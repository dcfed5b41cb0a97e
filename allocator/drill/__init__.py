"""``allocator drill``: failover rehearsals of a local or deployed cluster (docs/design.md §9,
§10). ``runner`` runs rounds of ``scenarios``' faults and judges them with the one checker
(:mod:`allocator.core.verify`); ``allocator/commands/drill.py`` is the click wrapper. Nothing
here is a test switch: the drill breaks a cluster only from outside, through real mechanisms.
"""
