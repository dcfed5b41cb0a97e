"""``allocator bench sustained``: claims a live cluster keeps up with, its synchronous standby
on and its leader cutting, next to a burst from a pre-filled pool and the server's fastest
durable commit on the same server.

``runner`` drives it; ``plan`` says what runs, ``queries`` holds the SQL, ``sampler`` and
``cpu`` collect the evidence during each run, ``evidence`` reads the counters around it,
``report`` prints and writes it.
"""
