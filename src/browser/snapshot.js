// Runs in the browser tool's own isolated world (page scripts cannot see or change its
// globals). Returns the page as text, one line per block, with [n] before each element one
// can act on; the elements are kept in this world's globalThis.__weftRefs for later actions.
(max) => {
  const refs = [];
  const secret = [];
  const out = [];
  let size = 0;
  let visited = 0;
  let cut = false;
  const ACT = new Set(["A", "BUTTON", "INPUT", "SELECT", "TEXTAREA", "SUMMARY", "OPTION"]);
  const ROLES = new Set(["button", "link", "checkbox", "radio", "tab", "menuitem", "switch",
    "option", "textbox", "combobox", "searchbox", "slider"]);
  const SKIP = new Set(["SCRIPT", "STYLE", "NOSCRIPT", "TEMPLATE", "HEAD", "META", "LINK", "SVG"]);
  const clean = (s) => (s || "").replace(/\s+/g, " ").trim();
  // Text of inline runs is joined into one line; blocks and actionable elements end it.
  let run = "";
  const flush = () => { const t = clean(run); run = ""; if (t) push(t); };
  const INLINE = new Set(["inline", "inline-block", "inline-flex", "contents"]);
  const push = (line) => {
    if (cut) return;
    if (size + line.length + 1 > max) { cut = true; return; }
    out.push(line); size += line.length + 1;
  };
  const visible = (el) => {
    if (!el.getClientRects().length) return false;
    const st = getComputedStyle(el);
    return st.visibility !== "hidden" && st.display !== "none";
  };
  const actionable = (el) => {
    if (el.tagName === "A") return el.hasAttribute("href");
    if (el.tagName === "OPTION") return false;
    if (ACT.has(el.tagName)) return !(el.tagName === "INPUT" && el.type === "hidden");
    const role = el.getAttribute("role");
    if (role && ROLES.has(role)) return true;
    return el.isContentEditable && el.parentElement && !el.parentElement.isContentEditable;
  };
  const roleOf = (el) => {
    const r = el.getAttribute("role");
    if (r) return r;
    switch (el.tagName) {
      case "A": return "link";
      case "BUTTON": case "SUMMARY": return "button";
      case "SELECT": return "combobox";
      case "TEXTAREA": return "textbox";
      case "INPUT": {
        const t = (el.type || "text").toLowerCase();
        if (["submit", "button", "reset", "image"].includes(t)) return "button";
        if (t === "checkbox" || t === "radio") return t;
        if (t === "password") return "password";
        return "textbox";
      }
      default: return el.isContentEditable ? "textbox" : "element";
    }
  };
  const nameOf = (el) => {
    const aria = el.getAttribute("aria-label");
    if (aria) return clean(aria);
    if (el.tagName === "INPUT" || el.tagName === "TEXTAREA" || el.tagName === "SELECT") {
      if (el.labels && el.labels.length) return clean(el.labels[0].innerText);
      if (el.tagName === "INPUT" && ["submit", "button", "reset"].includes(el.type)) return clean(el.value);
      return clean(el.getAttribute("placeholder") || el.getAttribute("name") || el.getAttribute("title"));
    }
    return clean(el.innerText || el.getAttribute("title") || el.getAttribute("alt")).slice(0, 200);
  };
  const describe = (el) => {
    flush();
    const n = refs.length + 1;
    refs.push(el);
    const role = roleOf(el);
    const ac = String(el.autocomplete || "").toLowerCase();
    if (role === "password" || ["current-password", "new-password", "one-time-code", "cc-number", "cc-csc"].some((k) => ac.includes(k))) secret.push(n);
    let line = `[${n}] ${role} "${nameOf(el)}"`;
    if (el.tagName === "A") {
      const h = el.getAttribute("href") || "";
      line += ` -> ${h.slice(0, 200)}`;
    }
    if (role === "password") {
      line += el.value ? " (filled)" : " (empty)";
    } else if (el.tagName === "INPUT" || el.tagName === "TEXTAREA") {
      if (el.type === "checkbox" || el.type === "radio") line += el.checked ? " checked" : " unchecked";
      else if (el.value) line += ` value="${clean(el.value).slice(0, 200)}"`;
    } else if (el.tagName === "SELECT") {
      const opts = Array.from(el.options).slice(0, 50).map((o) => (o.selected ? "*" : "") + clean(o.label));
      line += ` options=[${opts.join(" | ")}]`;
    }
    if (el.disabled) line += " disabled";
    push(line);
  };
  const walk = (node) => {
    if (cut || ++visited > 50000) { cut = true; return; }
    if (node.nodeType === 3) {
      run += node.data;
      return;
    }
    if (node.nodeType !== 1) return;
    const el = node;
    if (SKIP.has(el.tagName.toUpperCase())) return;
    if (!visible(el) && el.tagName !== "BODY") {
      // Children of a display:contents element have boxes of their own.
      if (getComputedStyle(el).display !== "contents") return;
    }
    if (actionable(el)) { describe(el); if (el.tagName !== "SELECT" && !el.isContentEditable && el.children.length === 0) return; if (["A", "BUTTON", "SELECT", "TEXTAREA", "INPUT", "SUMMARY"].includes(el.tagName)) return; }
    const block = !INLINE.has(getComputedStyle(el).display);
    if (block) flush();
    if (/^H[1-6]$/.test(el.tagName)) { flush(); push("#".repeat(+el.tagName[1]) + " " + clean(el.innerText)); return; }
    if (el.tagName === "IMG") { const a = clean(el.getAttribute("alt")); if (a) run += `[image: ${a}] `; return; }
    if (el.tagName === "IFRAME") { flush(); push("[frame: content not shown]"); return; }
    if (el.tagName === "BR") { flush(); return; }
    for (const c of el.childNodes) walk(c);
    if (block) flush();
  };
  if (document.body) walk(document.body);
  flush();
  globalThis.__weftRefs = refs;
  return { title: document.title, url: location.href, text: out.join("\n"), refs: refs.length, secret, cut };
}
