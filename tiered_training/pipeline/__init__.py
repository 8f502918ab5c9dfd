"""The SageMaker pipeline definition built from a Plan (a pure dict) and its validation against
SageMaker's rules and botocore's service model."""
