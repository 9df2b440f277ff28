"""The SQL store's Alembic environment, shipped in the package and driven from code
(``celery_fair.store.sql.migrate``): no ``alembic.ini``."""
