"""The contract between the planner and the container: the RunConfig, the model architecture, the metric
catalogue, the world size, failure reasons, ports and the container's constants. It imports nothing above it."""
