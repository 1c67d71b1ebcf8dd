// Validates the chart's custom resources (KEDA, Prometheus Operator) against the schemas
// published for them in @kubernetes-models (generated from the projects' CRDs): types,
// required fields, enums and formats. Unknown fields are not caught (the CRD schemas allow
// them). Usage: node validate-crds.mjs NODE_MODULES_DIR MANIFESTS.json
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const [modules, file] = process.argv.slice(2);
const models = {
  "keda.sh/v1alpha1/ScaledObject": "@kubernetes-models/keda/keda.sh/v1alpha1/ScaledObject.js",
  "monitoring.coreos.com/v1/ServiceMonitor": "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/ServiceMonitor.js",
  "monitoring.coreos.com/v1/PrometheusRule": "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/PrometheusRule.js",
};
let failed = 0;
for (const doc of JSON.parse(readFileSync(file, "utf8"))) {
  const key = `${doc.apiVersion}/${doc.kind}`;
  const where = `${doc.kind}/${doc.metadata?.name}`;
  if (!models[key]) {
    console.log(`  FAIL ${where}: no schema for ${key}`);
    failed++;
    continue;
  }
  const mod = await import(pathToFileURL(join(modules, models[key])).href);
  try {
    new mod[doc.kind](doc).validate();
    console.log(`  ok   ${where} (${key})`);
  } catch (e) {
    console.log(`  FAIL ${where}: ${e.message}`);
    failed++;
  }
}
process.exit(failed ? 1 : 0);
