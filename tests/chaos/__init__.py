"""Chaos tests: faults through real mechanisms, each run judged by the product's invariant
checker (:func:`allocator.core.verify.check`, I1-I5 and the clock rule; the demo and the drill
use the same one, and the same consumer recorder, :mod:`allocator.drill.consumers`).

Each scenario starts an embedded cluster of its own (``harness.ChaosCluster``: up ~2.5 s,
down ~1.5 s, included below) and ends with the checker finding nothing, except the proof
that it can find something. Measured cost on a 2-core machine, cheapest first (each test's
docstring repeats it); the whole folder takes about 200 s:

====  ==========================================================  ===========================
 s    scenario                                                    test
====  ==========================================================  ===========================
 ~4   forced ZooKeeper session expiry of the leader               test_node_faults
 ~4   PostgreSQL ``stop -m immediate`` during refill, restart     test_postgres_faults
 ~5   SIGKILL of the leader                                       test_node_faults
 ~5   node-ZooKeeper link cut shorter than the session            test_zookeeper_link
 ~5   one ZooKeeper server (the ensemble's leader) killed         test_zookeeper_faults
 ~6   SIGSTOP of the leader past the session timeout              test_node_faults
 ~7   node-ZooKeeper link cut longer than the session             test_zookeeper_link
 ~7   SIGSTOP + silent partition: PostgreSQL fences it (AL100)    test_zookeeper_link
 ~5   a follower cut off past its session                         test_zookeeper_link
 ~15  ZooKeeper quorum lost, then restored                        test_zookeeper_faults
 ~2   the PostgreSQL proxy's black hole drops, never refuses      test_postgres_link
 ~3   a leader moving the mark an hour ahead (checker proof, I5)  test_checker_proof
 ~10  a leader's clock -1 min / +1 h / +60 years (libfaketime)    test_clock_skew (x3)
 ~12  the fence-less leader (proof the checker catches I3)        test_checker_proof
 ~13  the leader's PostgreSQL link black-holed: it hands over     test_postgres_link
 ~14  every ZooKeeper server wiped, `fence rebase` (x2 modes)     test_zookeeper_rebuilt
 ~21  every node's PostgreSQL link black-holed: no churn          test_postgres_link
====  ==========================================================  ===========================
"""
