// Evaluate IAM requests with @cloud-copilot/iam-simulate (https://github.com/cloud-copilot/iam-simulate).
// stdin: a JSON list of simulations ({request, identityPolicies, resourcePolicy, ...}, the library's
// Simulation shape; principal "anonymous" means an unsigned request). stdout: a JSON list, one
// {result, errors} per simulation, in order. Strict mode: the request context is exactly what is given.
import { anonymousPrincipal, runSimulation } from '@cloud-copilot/iam-simulate'

const chunks = []
for await (const chunk of process.stdin) chunks.push(chunk)
const simulations = JSON.parse(Buffer.concat(chunks).toString('utf8'))
const out = []
for (const simulation of simulations) {
  if (simulation.request.principal === 'anonymous') simulation.request.principal = anonymousPrincipal
  simulation.serviceControlPolicies ??= []
  simulation.resourceControlPolicies ??= []
  simulation.identityPolicies ??= []
  const response = await runSimulation(simulation, { simulationMode: 'Strict' })
  if (response.resultType === 'error') {
    out.push({ result: 'Error', errors: response.errors })
  } else {
    out.push({ result: response.overallResult, errors: null })
  }
}
process.stdout.write(JSON.stringify(out))
