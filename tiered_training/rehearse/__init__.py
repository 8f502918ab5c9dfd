"""Local rehearsal of a recipe's SageMaker pipeline: its own definition, interpreted step by step, with
each Training step run as N simulated hosts (one ``/opt/ml`` tree and one torchrun each) against S3
on a loopback moto server. See docs/rehearse.md.

Nothing here is imported by ``import tiered_training``; the modules load boto3, moto and the
trainer's processes only when a rehearsal runs.
"""
