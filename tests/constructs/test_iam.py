"""TrainingRoles and CheckpointStore grants: least privilege, no managed policies, Resource "*" only where IAM requires it."""

from __future__ import annotations

import json

from cdk_helpers import join_to_text, resources

from tiered_training.constructs.platform import stack_id

# Actions that have no resource-level permissions, so IAM requires Resource "*" (see roles.py).
STAR_ONLY = {
    "ecr:GetAuthorizationToken", "cloudwatch:PutMetricData",
    "ec2:DescribeNetworkInterfaces", "ec2:DescribeVpcs", "ec2:DescribeDhcpOptions", "ec2:DescribeSubnets",
    "ec2:DescribeSecurityGroups",
}


def statements(template: dict, role_fragment: str) -> list[dict]:
    roles = [k for k in resources(template, "AWS::IAM::Role") if role_fragment in k]
    assert len(roles) == 1, roles
    out = []
    for policy in resources(template, "AWS::IAM::Policy").values():
        if {"Ref": roles[0]} in policy["Properties"]["Roles"]:
            out += policy["Properties"]["PolicyDocument"]["Statement"]
    return out


def actions(statement: dict) -> list[str]:
    value = statement["Action"]
    return value if isinstance(value, list) else [value]


def test_no_managed_policies_anywhere(templates):
    for name, template in templates.items():
        for role in resources(template, "AWS::IAM::Role").values():
            assert "ManagedPolicyArns" not in role["Properties"], name
        assert "AmazonSageMakerFullAccess" not in json.dumps(template)


def test_resource_star_only_where_iam_requires_it(templates):
    for name, template in templates.items():
        for policy in resources(template, "AWS::IAM::Policy").values():
            for statement in policy["Properties"]["PolicyDocument"]["Statement"]:
                if statement["Resource"] == "*" or "*" in (statement["Resource"] if isinstance(statement["Resource"], list) else []):
                    assert set(actions(statement)) <= STAR_ONLY, (name, statement)
                for action in actions(statement):
                    assert "*" not in action, (name, action)


def test_pipeline_role_creates_only_pipeline_jobs_and_passes_only_its_role(templates):
    template = templates[stack_id("llama3-8b-fp8")]
    stmts = statements(template, "RolesPipelineRole")
    by_action = {a: s for s in stmts for a in actions(s)}
    assert set(by_action) == {
        "sagemaker:CreateTrainingJob", "sagemaker:DescribeTrainingJob", "sagemaker:StopTrainingJob",
        "sagemaker:AddTags", "iam:PassRole", "sagemaker:CreateModelPackage",
    }
    # the Register step: packages of the recipe's own group only, with the recipe's approval status
    registers = by_action["sagemaker:CreateModelPackage"]
    assert "model-package/llama3-8b-fp8/*" in json.dumps(registers["Resource"])
    assert registers["Condition"] == {"StringEquals": {"sagemaker:ModelApprovalStatus": "PendingManualApproval"}}
    jobs = json.dumps(by_action["sagemaker:CreateTrainingJob"]["Resource"])
    assert "training-job/pipelines-*" in jobs
    passed = by_action["iam:PassRole"]
    assert "Fn::GetAtt" in passed["Resource"] and "ExecutionRole" in passed["Resource"]["Fn::GetAtt"][0]
    assert passed["Condition"] == {"StringEquals": {"iam:PassedToService": "sagemaker.amazonaws.com"}}


def test_execution_role_reads_data_and_writes_only_its_prefixes(templates):
    template = templates[stack_id("llama3-8b-fp8")]
    stmts = statements(template, "RolesExecutionRole")
    text = json.dumps(stmts)
    assert "example-training-data/fineweb-edu/llama3-tokens/*" in text
    assert "example-model-artifacts/llama-3.1-8b/hf/*" in text  # the init checkpoint channel
    writes = [s for s in stmts if "s3:PutObject" in actions(s) and s["Effect"] == "Allow"]
    assert len(writes) == 1
    # The prepared shards and the Prepare job's property file are the Prepare role's to write.
    (deny,) = [s for s in stmts if s["Effect"] == "Deny"]
    assert {"s3:PutObject", "s3:DeleteObject"} <= set(actions(deny))
    assert "/llama3-8b-fp8/output/prepared/*" in json.dumps(deny["Resource"])
    resources_text = json.dumps(writes[0]["Resource"])
    assert "/llama3-8b-fp8/checkpoints/*" in resources_text and "/llama3-8b-fp8/output/*" in resources_text
    assert "qwen" not in resources_text
    listing = [s for s in stmts if actions(s) == ["s3:ListBucket"]]
    assert all("s3:prefix" in json.dumps(s.get("Condition", {})) for s in listing)
    kms = [s for s in stmts if "kms:GenerateDataKey" in actions(s)]
    assert len(kms) == 1 and "Fn::ImportValue" in json.dumps(kms[0]["Resource"])
    # OutputDataConfig.KmsKeyId is the store's key: CreateTrainingJob needs kms:Encrypt on it.
    assert {"kms:Decrypt", "kms:Encrypt", "kms:GenerateDataKey"} <= set(actions(kms[0]))
    ecr = [s for s in stmts if "ecr:BatchGetImage" in actions(s)]
    assert len(ecr) == 1
    logs = [s for s in stmts if "logs:PutLogEvents" in actions(s)]
    assert "/aws/sagemaker/TrainingJobs" in json.dumps(logs)
    metric = next(s for s in stmts if actions(s) == ["cloudwatch:PutMetricData"])
    assert metric["Condition"] == {"StringEquals": {"cloudwatch:namespace": "/aws/sagemaker/TrainingJobs"}}


def test_roles_trust_only_sagemaker_from_this_account(templates):
    template = templates[stack_id("llama3-8b-fp8")]
    for role in resources(template, "AWS::IAM::Role").values():
        (statement,) = role["Properties"]["AssumeRolePolicyDocument"]["Statement"]
        assert statement["Principal"] == {"Service": "sagemaker.amazonaws.com"}
        assert "aws:SourceAccount" in json.dumps(statement["Condition"])


def test_execution_role_reads_exactly_the_allowed_data_prefixes_and_decrypts_with_the_data_key(templates):
    stmts = statements(templates[stack_id("data-variant")], "RolesExecutionRole")
    reads = [s for s in stmts if actions(s) == ["s3:GetObject"]]
    read_arns = sorted(join_to_text(r) for s in reads for r in (s["Resource"] if isinstance(s["Resource"], list) else [s["Resource"]]))
    # Whole path segments, as DataSection.allows: s3://bucket-a/tokens covers the object "tokens"
    # and tokens/..., not tokens-v2/...; nothing else is readable.
    assert [a.split(":s3:::")[1] for a in read_arns] == ["bucket-a/tokens", "bucket-a/tokens/*", "bucket-b/shared/*"]
    listing = {json.dumps(s["Resource"]): s["Condition"]["StringLike"]["s3:prefix"] for s in stmts if actions(s) == ["s3:ListBucket"]}
    assert sorted(v for k, v in listing.items() if "bucket-a" in k) == [["tokens/*", "tokens"]]
    assert sorted(v for k, v in listing.items() if "bucket-b" in k) == [["shared/*"]]
    decrypt = [s for s in stmts if actions(s) == ["kms:Decrypt"]]
    assert [s["Resource"] for s in decrypt] == ["arn:aws:kms:us-east-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab"]

