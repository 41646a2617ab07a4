"""One-shot jobs on the session log (the batch API's machinery).

A job is a session whose records say what was asked (``job``), how far it
came (``progress``) and what it produced (``result``, the body in the
:class:`~duplex_server.jobs.blobs.BlobStore`), then ``close``. The
:class:`~duplex_server.jobs.runner.JobRunner` runs them: idempotent retries,
per-key limits, recovery after a crash, retention.
"""
