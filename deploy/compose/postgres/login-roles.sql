-- Login roles, after the migrations have created the NOLOGIN groups (docs/sql.md, "Roles and
-- privileges"); run by the compose stack's `db-roles` service as allocator_migrator (which
-- has CREATEROLE) at every `up`, so it is idempotent and sets the passwords of the secrets.
--   allocator_node_login: the nodes' postgres.url, a member of allocator_node;
--   allocator_app:        applications that claim IDs, a member of allocator_consumer.
-- The names are those of the embedded cluster (`allocator local`). More applications:
--   CREATE ROLE orders_api LOGIN PASSWORD '...' IN ROLE allocator_consumer;
\set node_password `cat /run/secrets/node_db_password`
\set app_password `cat /run/secrets/app_db_password`

SELECT format('CREATE ROLE %I LOGIN', name)
  FROM (VALUES ('allocator_node_login'), ('allocator_app')) AS wanted (name)
 WHERE NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = name)
\gexec

ALTER ROLE allocator_node_login LOGIN PASSWORD :'node_password';
ALTER ROLE allocator_app LOGIN PASSWORD :'app_password';
GRANT allocator_node TO allocator_node_login;
GRANT allocator_consumer TO allocator_app;
