// Evaluate IAM requests with @cloud-copilot/iam-simulate (https://github.com/cloud-copilot/iam-simulate).
// stdin: a JSON list of simulations ({request, identityPolicies, resourcePolicy, ...}, the library's
// Simulation shape; principal "anonymous" means an unsigned request). stdout: a JSON list, one
// {result, errors} per simulation, in order. Strict mode: the request context is exactly what is given.
//
// runSimulation validates the policies, the action, the resource type and the context keys, and
// drops context keys it does not know for the action. It does not know KMS's
// kms:EncryptionContext:<key> keys (it matches variable keys of the form prefix/<name> only), so a
// request that carries one is evaluated again, after validation, with runUnsafeSimulation and its
// whole context. Any other dropped key is reported as an error: no request may silently lose a key.
// With --lines: one JSON list per stdin line, one result list per stdout line.
import { createValidatedPolicy, validateResourcePolicy } from '@cloud-copilot/iam-policy'
import { anonymousPrincipal, runSimulation, runUnsafeSimulation } from '@cloud-copilot/iam-simulate'
import { createInterface } from 'node:readline'

const ENCRYPTION_CONTEXT = /^kms:encryptioncontext:/i

async function evaluate(simulations) {
const out = []
for (const simulation of simulations) {
  if (simulation.request.principal === 'anonymous') simulation.request.principal = anonymousPrincipal
  simulation.serviceControlPolicies ??= []
  simulation.resourceControlPolicies ??= []
  simulation.identityPolicies ??= []
  const response = await runSimulation(simulation, { simulationMode: 'Strict' })
  if (response.resultType === 'error') {
    out.push({ result: 'Error', errors: response.errors })
    continue
  }
  const ignored = response.result?.ignoredContextKeys ?? []
  const unknown = ignored.filter((key) => !ENCRYPTION_CONTEXT.test(key))
  if (unknown.length > 0) {
    out.push({ result: 'Error', errors: { message: `context keys not evaluated for ${simulation.request.action}: ${unknown.join(', ')}` } })
  } else if (ignored.length > 0) {
    const resourcePolicy = simulation.resourcePolicy
      ? createValidatedPolicy(simulation.resourcePolicy, validateResourcePolicy, { name: 'resource policy' })
      : undefined
    out.push({ result: runUnsafeSimulation({ ...simulation, resourcePolicy }, { simulationMode: 'Strict' }), errors: null })
  } else {
    out.push({ result: response.overallResult, errors: null })
  }
}
return out
}

if (process.argv.includes('--lines')) {
  // One JSON list of simulations per input line, one JSON list of results per output line,
  // so a caller keeps one process for many small requests.
  for await (const line of createInterface({ input: process.stdin })) {
    if (line.trim() === '') continue
    process.stdout.write(JSON.stringify(await evaluate(JSON.parse(line))) + '\n')
  }
} else {
  const chunks = []
  for await (const chunk of process.stdin) chunks.push(chunk)
  process.stdout.write(JSON.stringify(await evaluate(JSON.parse(Buffer.concat(chunks).toString('utf8')))))
}
