"""The PostgreSQL adapter: the node's store, the operator's calls, the SQL, migrations."""
