"""The Redis / Redis Cluster directory backend (``--directory redis://HOST:PORT/DB``), one module
per part: :mod:`.backend` composes them (:class:`~.backend.RedisDirectory`); :mod:`.url` parses the
URL without importing redis-py, so importing this package loads nothing more."""
