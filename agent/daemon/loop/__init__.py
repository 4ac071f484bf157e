"""The scheduler loop: requests, placement, each task's lifecycle, preemption, migration and
recovery after a restart. It drives the store and the executor; it imports nothing of the
API."""
