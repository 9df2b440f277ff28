"""The SQL store (SQLAlchemy Core): PostgreSQL, MariaDB/MySQL and SQLite."""
