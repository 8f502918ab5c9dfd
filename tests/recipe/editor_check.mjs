// Check recipes as an editor does: parse with the npm `yaml` package (YAML 1.2, core schema; the
// parser yaml-language-server uses) and validate against a JSON Schema with Ajv (draft 2020-12).
// argv[2]: the schema file. stdin: a JSON list of {name, text}. stdout: a JSON list, one
// {name, errors: [{path, message}]} per document, in order; no errors means the document is valid.
//
// YAML 1.2 resolves `1.0` to a float and `1` to an integer (https://yaml.org/spec/1.2.2/#1032-tag-resolution);
// a JSON value loses the difference. As the YAML language server's number nodes did (isInteger from the
// scalar's tag), a plain scalar that resolves to a float fails `type: integer` here.
import { readFileSync } from 'node:fs'
import Ajv2020 from 'ajv/dist/2020.js'
import { isAlias, isMap, isScalar, isSeq, parseDocument } from 'yaml'

const CORE_INT = /^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$/

// JSON pointers of the plain scalars that YAML 1.2 resolves to floats.
function floats(node, doc, pointer, found) {
  if (isAlias(node)) node = node.resolve(doc)
  if (isMap(node)) {
    for (const pair of node.items) {
      const key = isScalar(pair.key) ? String(pair.key.value) : String(pair.key)
      floats(pair.value, doc, `${pointer}/${key.replace(/~/g, '~0').replace(/\//g, '~1')}`, found)
    }
  } else if (isSeq(node)) {
    node.items.forEach((item, index) => floats(item, doc, `${pointer}/${index}`, found))
  } else if (isScalar(node) && typeof node.value === 'number' && node.type === 'PLAIN' && !CORE_INT.test(node.source)) {
    found.add(pointer)
  }
  return found
}

// The schema, with a check beside every `type: integer` that the scalar is not a YAML float.
function marked(schema) {
  if (Array.isArray(schema)) return schema.map(marked)
  if (schema === null || typeof schema !== 'object') return schema
  const out = Object.fromEntries(Object.entries(schema).map(([key, value]) => [key, marked(value)]))
  if (schema.type === 'integer') out.yamlInteger = true
  return out
}

let current = new Set()
const ajv = new Ajv2020({ allErrors: true, strict: true })
ajv.addKeyword({
  keyword: 'yamlInteger',
  schemaType: 'boolean',
  errors: true,
  validate: function check(_schema, _data, _parent, context) {
    if (!current.has(context.instancePath)) return true
    check.errors = [{ keyword: 'yamlInteger', message: 'must be integer (YAML 1.2 reads this as a float)', params: {} }]
    return false
  },
})
const validate = ajv.compile(marked(JSON.parse(readFileSync(process.argv[2], 'utf8'))))

const out = []
for (const { name, text } of JSON.parse(readFileSync(0, 'utf8'))) {
  const doc = parseDocument(text)
  if (doc.errors.length > 0) {
    out.push({ name, errors: doc.errors.map((e) => ({ path: '', message: `YAML: ${e.message}` })) })
    continue
  }
  current = floats(doc.contents, doc, '', new Set())
  const valid = validate(doc.toJS())
  const errors = valid ? [] : validate.errors.map((e) => ({ path: e.instancePath, message: e.message }))
  out.push({ name, errors })
}
process.stdout.write(JSON.stringify(out))
