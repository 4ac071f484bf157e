"""What the agent shows: metrics, their collectors and the exporter."""
