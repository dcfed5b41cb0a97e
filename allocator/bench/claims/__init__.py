"""``allocator bench claims``: ``claim_blocks`` next to a SKIP LOCKED queue, a Leaf-style
segment, ``nextval`` and the server's fastest durable commit, driven by pgbench.

``runner`` drives the matrix; what is measured and how sits on its functions and on
``contenders``, ``database`` and ``pgbench``; ``sql/`` holds the pgbench scripts.
"""
