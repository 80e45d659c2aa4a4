// The engine options form, built from the JSON schema each engine publishes in GET /engines.

import { el } from "./dom.js";

export function optionFields(schema) {
  return Object.entries(schema?.properties ?? {}).map(([name, property]) =>
    optionField(name, property),
  );
}

// The values to send with the offer, keyed by option name.
export function readOptions(container) {
  const options = {};
  for (const input of container.querySelectorAll("[name]")) {
    if (input.type === "checkbox") options[input.name] = input.checked;
    else if (input.type !== "number") options[input.name] = input.value;
    // An empty optional number is left out so the server applies its own default.
    else if (!Number.isNaN(input.valueAsNumber)) options[input.name] = input.valueAsNumber;
  }
  return options;
}

function optionField(name, schema) {
  const input = Object.assign(optionInput(schema), { id: `option-${name}`, name });
  const label = el("label", { htmlFor: input.id, textContent: name.replaceAll("_", " ") });
  const isCheckbox = input.type === "checkbox";
  const row = el("div", { className: isCheckbox ? "field field-check" : "field" });
  row.append(...(isCheckbox ? [input, label] : [label, input]));
  if (schema.description) {
    const hint = el("p", { id: `${input.id}-hint`, className: "hint" }, schema.description);
    input.setAttribute("aria-describedby", hint.id);
    row.append(hint);
  }
  return row;
}

function optionInput(schema) {
  if (schema.type === "boolean") {
    return el("input", { type: "checkbox", checked: Boolean(schema.default) });
  }
  if (Array.isArray(schema.enum)) {
    const select = el("select", {}, ...schema.enum.map((choice) => new Option(choice, choice)));
    select.value = schema.default ?? schema.enum[0];
    return select;
  }
  if (schema.type === "number" || schema.type === "integer") {
    return el("input", {
      type: "number",
      step: schema.type === "integer" ? "1" : "any",
      min: schema.minimum ?? "",
      max: schema.maximum ?? "",
      // With a default to fall back on, an empty box is a mistake the browser should point out.
      required: typeof schema.default === "number",
      value: schema.default ?? "",
    });
  }
  return el("input", { type: "text", value: schema.default ?? "" });
}
