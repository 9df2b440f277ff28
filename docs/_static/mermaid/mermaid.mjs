// sphinxcontrib-mermaid imports Mermaid as an ES module; the vendored mermaid.min.js (a
// classic script, loaded before this module on every page with a diagram) sets the global.
export default globalThis.mermaid;
