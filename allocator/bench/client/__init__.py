"""``allocator bench client``: the Python client's IDs/s and the latency of every
``next_id()``, against a real pool.

``runner`` runs it (what is measured and how sits on its functions); ``claimer`` records
claims, ``timing`` times the loop, ``results`` and ``report`` give the JSON and the table.
"""
