"""The comparison engine, plain Python without pytest: settings, the evaluation input, the
orchestrator that runs the reference once and each candidate on the same ids, the reference's
outputs kept in memory or on disk (a reference larger than RAM streams in runners/streaming.py)."""
