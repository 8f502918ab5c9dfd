"""TrainingRoles and CheckpointStore grants: least privilege, no managed policies, Resource "*" only where IAM requires it."""

from __future__ import annotations

import json

from cdk_helpers import resources

from tiered_training.constructs.platform import stack_id

# Actions that have no resource-level permissions, so IAM requires Resource "*" (see roles.py / image.py).
STAR_ONLY = {"ecr:GetAuthorizationToken", "cloudwatch:PutMetricData"}


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
        "sagemaker:AddTags", "iam:PassRole",
    }
    jobs = json.dumps(by_action["sagemaker:CreateTrainingJob"]["Resource"])
    assert "training-job/pipelines-*" in jobs
    passed = by_action["iam:PassRole"]["Resource"]
    assert "Fn::GetAtt" in passed and "ExecutionRole" in passed["Fn::GetAtt"][0]


def test_execution_role_reads_data_and_writes_only_its_prefixes(templates):
    template = templates[stack_id("llama3-8b-fp8")]
    stmts = statements(template, "RolesExecutionRole")
    text = json.dumps(stmts)
    assert "example-training-data/fineweb-edu/llama3-tokens/*" in text
    assert "example-model-artifacts/llama-3.1-8b/hf/*" in text  # the init checkpoint channel
    writes = [s for s in stmts if "s3:PutObject" in actions(s)]
    assert len(writes) == 1
    resources_text = json.dumps(writes[0]["Resource"])
    assert "/llama3-8b-fp8/checkpoints/*" in resources_text and "/llama3-8b-fp8/output/*" in resources_text
    assert "qwen" not in resources_text
    listing = [s for s in stmts if actions(s) == ["s3:ListBucket"]]
    assert all("s3:prefix" in json.dumps(s.get("Condition", {})) for s in listing)
    kms = [s for s in stmts if "kms:GenerateDataKey" in actions(s)]
    assert len(kms) == 1 and "Fn::ImportValue" in json.dumps(kms[0]["Resource"])
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


def test_minimize_statements_merges_like_cdk():
    from tiered_training.constructs.roles import minimize_statements

    merged = minimize_statements([
        {"Effect": "Allow", "Action": "s3:GetObject", "Resource": "arn:b/*"},
        {"Effect": "Allow", "Action": "s3:ListBucket", "Resource": "arn:b", "Condition": {"StringLike": {"s3:prefix": ["x*"]}}},
        {"Effect": "Allow", "Action": "s3:GetObject", "Resource": "arn:a/*"},
        {"Effect": "Allow", "Action": ["logs:B", "logs:A"], "Resource": "arn:l"},
        {"Effect": "Allow", "Action": "logs:C", "Resource": "arn:l"},
    ])
    assert merged == [
        {"Action": "s3:GetObject", "Effect": "Allow", "Resource": ["arn:a/*", "arn:b/*"]},
        {"Action": "s3:ListBucket", "Condition": {"StringLike": {"s3:prefix": ["x*"]}}, "Effect": "Allow", "Resource": "arn:b"},
        {"Action": ["logs:A", "logs:B", "logs:C"], "Effect": "Allow", "Resource": "arn:l"},
    ]


def test_roles_are_grantable_and_take_a_data_key(tmp_path):
    from aws_cdk import App, Stack, assertions
    from aws_cdk import aws_kms as kms

    from tiered_training.constructs import CheckpointStore, TrainingImage, TrainingRoles

    stack = Stack(App(outdir=str(tmp_path)), "S")
    store = CheckpointStore(stack, "Store")
    image = TrainingImage(stack, "Image", image_uri="123456789012.dkr.ecr.us-west-2.amazonaws.com/trainer:1.0")
    key = kms.Key(stack, "DataKey")
    roles = TrainingRoles(stack, "Roles", recipe_name="r1", store=store, image=image,
                          data_uris=["s3://data/tokens/"], data_key=key)
    store.grant_recipe_read(roles.pipeline_role, "r1")  # a grant to the IRole view: an extra policy on the role
    template = assertions.Template.from_stack(stack).to_json()
    policies = resources(template, "AWS::IAM::Policy")
    assert len(policies) == 3
    (pipeline_role,) = [k for k in resources(template, "AWS::IAM::Role") if "PipelineRole" in k]
    extra = [p for k, p in policies.items() if "DefaultPolicy" not in k]
    assert extra[0]["Properties"]["Roles"] == [{"Ref": pipeline_role}]
    execution = next(p for k, p in policies.items() if "ExecutionRoleDefaultPolicy" in k)
    assert execution["Properties"]["PolicyName"] == next(k for k in policies if "ExecutionRoleDefaultPolicy" in k)
    decrypt = [s for s in execution["Properties"]["PolicyDocument"]["Statement"] if s["Action"] == "kms:Decrypt"]
    assert decrypt and "DataKey" in json.dumps(decrypt)


def test_default_policy_names_are_their_logical_ids(tmp_path):
    # Inside a stack (path known: the name is computed) and under a foreign construct (the logical ID token).
    from aws_cdk import App, Stack, assertions
    from constructs import Construct

    from tiered_training.constructs import CheckpointStore, TrainingImage, TrainingRoles

    stack = Stack(App(outdir=str(tmp_path)), "S")
    store = CheckpointStore(stack, "Store")
    image = TrainingImage(stack, "Image", image_uri="123456789012.dkr.ecr.us-west-2.amazonaws.com/trainer:1.0")
    TrainingRoles(stack, "Roles", recipe_name="r1", store=store, image=image, data_uris=["s3://data/tokens/"])
    TrainingRoles(Construct(stack, "Team-A"), "Roles", recipe_name="r2", store=store, image=image, data_uris=["s3://data/x/"])
    policies = resources(assertions.Template.from_stack(stack).to_json(), "AWS::IAM::Policy")
    assert len(policies) == 4
    for logical, policy in policies.items():
        assert policy["Properties"]["PolicyName"] == logical
