"""CheckpointStore and TrainingPlatform: one bucket, one image, one topic for every recipe."""

from __future__ import annotations

import json

from cdk_helpers import only, resources

from tiered_training.constructs.app import PLATFORM_STACK


def test_checkpoint_bucket(templates):
    template = templates[PLATFORM_STACK]
    buckets = resources(template, "AWS::S3::Bucket")
    (store_id,) = [k for k in buckets if "StoreBucket" in k]
    bucket = buckets[store_id]
    props = bucket["Properties"]
    assert bucket["DeletionPolicy"] == "Retain" and bucket["UpdateReplacePolicy"] == "Retain"
    assert props["VersioningConfiguration"] == {"Status": "Enabled"}
    assert props["PublicAccessBlockConfiguration"] == {
        "BlockPublicAcls": True, "BlockPublicPolicy": True, "IgnorePublicAcls": True, "RestrictPublicBuckets": True,
    }
    sse = props["BucketEncryption"]["ServerSideEncryptionConfiguration"][0]
    assert sse["ServerSideEncryptionByDefault"]["SSEAlgorithm"] == "aws:kms"
    assert "KMSMasterKeyID" in sse["ServerSideEncryptionByDefault"]
    rules = {rule["Id"]: rule for rule in props["LifecycleConfiguration"]["Rules"]}
    rule = rules.pop("noncurrent-and-multipart")
    assert rule["NoncurrentVersionExpiration"] == {"NoncurrentDays": 30}
    assert rule["AbortIncompleteMultipartUpload"] == {"DaysAfterInitiation": 7}
    # Each recipe's pruned checkpoints leave the bucket a day after SageMaker deletes them.
    recipes = [name for name in templates if name != PLATFORM_STACK]
    assert len(rules) == len(recipes)
    for rule in rules.values():
        assert rule["Prefix"].endswith("/checkpoints/") and rule["Status"] == "Enabled"
        assert rule["NoncurrentVersionExpiration"] == {"NoncurrentDays": 1}
    assert "LoggingConfiguration" in props
    policies = [p for p in resources(template, "AWS::S3::BucketPolicy").values() if p["Properties"]["Bucket"] == {"Ref": store_id}]
    (policy,) = policies
    deny_tls = [s for s in policy["Properties"]["PolicyDocument"]["Statement"] if s["Effect"] == "Deny"]
    assert deny_tls and deny_tls[0]["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
    keys = resources(template, "AWS::KMS::Key")
    assert all(k["Properties"]["EnableKeyRotation"] for k in keys.values())


def test_one_shared_store_image_and_topic(templates, plans):
    platform = templates[PLATFORM_STACK]
    assert len([k for k in resources(platform, "AWS::S3::Bucket") if "StoreBucket" in k]) == 1
    assert len(resources(platform, "AWS::SNS::Topic")) == 1
    for name, template in templates.items():
        if name == PLATFORM_STACK:
            continue
        assert not resources(template, "AWS::S3::Bucket"), name
        assert "Fn::ImportValue" in json.dumps(only(template, "AWS::IAM::Role" if False else "AWS::SageMaker::Pipeline"))


def test_image_is_an_asset_built_from_training_dockerfile(assembly_dir):
    manifest = json.loads((assembly_dir / f"{PLATFORM_STACK}.assets.json").read_text())
    images = manifest["dockerImages"]
    assert len(images) == 1
    (image,) = images.values()
    assert image["source"]["dockerFile"] == "training/Dockerfile"
    staged = assembly_dir / image["source"]["directory"]
    assert (staged / "training" / "launcher.py").is_file()
    assert not (staged / ".venv").exists() and not (staged / "node_modules").exists()


def test_existing_image_and_bucket(tmp_path):
    from aws_cdk import App, Stack, assertions
    from aws_cdk import aws_iam as iam
    from aws_cdk import aws_s3 as s3

    from tiered_training.constructs import CheckpointStore, TrainingImage

    stack = Stack(App(outdir=str(tmp_path)), "S")
    image = TrainingImage(stack, "Image", image_uri="123456789012.dkr.ecr.us-west-2.amazonaws.com/trainer:1.0")
    bucket = s3.Bucket.from_bucket_name(stack, "Existing", "my-checkpoints")
    store = CheckpointStore(stack, "Store", bucket=bucket)
    role = iam.Role(stack, "R", assumed_by=iam.ServicePrincipal("sagemaker.amazonaws.com"))
    image.grant_pull(role)
    store.grant_recipe_read_write(role, "r1")
    template = assertions.Template.from_stack(stack)
    template.resource_count_is("AWS::S3::Bucket", 0)
    text = json.dumps(template.to_json())
    assert "repository/trainer" in text and "my-checkpoints/r1/checkpoints/*" in text
    assert store.checkpoint_uri("r1") == "s3://my-checkpoints/r1/checkpoints/"
