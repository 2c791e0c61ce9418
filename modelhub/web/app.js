// The page's entry point: tabs, and the first load of the model list.

import { initChat, setModels, setStatus } from "./chat.js";
import { initModels, refreshModels, refreshPs } from "./models.js";

function showTab(name) {
  for (const tab of document.querySelectorAll(".tab")) tab.classList.toggle("active", tab.dataset.tab === name);
  for (const panel of document.querySelectorAll(".panel")) panel.hidden = panel.id !== name;
  if (name === "running") refreshPs().catch((err) => setStatus(err.message));
  if (name === "models") refreshModels().catch((err) => setStatus(err.message));
}

async function main() {
  for (const tab of document.querySelectorAll(".tab")) tab.addEventListener("click", () => showTab(tab.dataset.tab));
  initModels(setModels);
  let models = [];
  try {
    models = await refreshModels();
  } catch (err) {
    setStatus(`cannot list models: ${err.message}`);
  }
  initChat(models);
  setModels(models);
  document.body.dataset.ready = "1";
}

main();
