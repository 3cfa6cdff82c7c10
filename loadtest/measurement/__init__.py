"""What is measured and derived: a request's record, statistics, /metrics, the content check, service
targets, and the shape of results.json."""
