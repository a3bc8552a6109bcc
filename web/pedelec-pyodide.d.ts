// Types for web/pedelec-pyodide.js (the page loader and JS bridge).
// The string unions spell pedelec_pyodide/protocol.py's closed sets (and context.Source):
// tests/core/test_closed_sets.py fails when they differ.
import type { PyodideAPI } from "pyodide";

export type SessionState = "connecting" | "idle" | "running" | "waiting_tool_result" | "closed";
export type HandledBy = "named" | "inline" | "fallback" | "none";
/** Who asked for a tool request: Core (its agent, MCP clients, the control API), the
 * browser's own agent through WebMCP, or the page's own code (`session.dispatch`). */
export type ToolSource = "core" | "webmcp" | "local";

export interface ToolErrorResult {
  error: { code: string; message: string; details?: unknown; retryable?: boolean };
}

export interface StateChangeDetail { state: SessionState; id: string | null }
export interface ToolCallDetail {
  toolRequestId: string;
  turnId: string | null;
  tool: string;
  args: unknown;
  /** The JSON result sent to Core (error results included). */
  result: unknown;
  handledBy: HandledBy;
  durationMs: number;
  source: ToolSource;
}
export interface DeltaDetail { turnId: string; text: string }
export interface TurnEndDetail {
  turnId: string;
  status: "completed" | "failed" | "cancelled";
  text: string;
  error: { code: string; message: string } | null;
}
export interface WelcomeDetail { id: string; resumed: boolean; state: SessionState }
export type PendingStatus = "awaiting_approval" | "running" | "waiting_for_user";
export interface ProgressValue { progress: number; total: number | null; message: string | null }
export interface ToolStatusDetail {
  toolRequestId: string;
  tool: string;
  turnId: string | null;
  status: PendingStatus | "done";
  source: ToolSource;
}
export interface ToolProgressDetail extends ProgressValue {
  toolRequestId: string;
  tool: string;
  turnId: string | null;
  source: ToolSource;
}
export interface ApprovalDetail {
  toolRequestId: string; tool: string; args: unknown; turnId: string | null;
  /** "webmcp": the browser's own agent asks (a page may deny all of those) */
  source: ToolSource;
}
export interface PendingToolRequest {
  toolRequestId: string;
  tool: string;
  turnId: string | null;
  status: PendingStatus;
  progress: ProgressValue | null;
  source: ToolSource;
}
/** A tool waiting for the user's approval; the first approve()/deny() decides. */
export declare class ApprovalEvent extends CustomEvent<ApprovalDetail> {
  /** Run the tool; false if it was decided (or answered) already. */
  approve(): boolean;
  /** Refuse it: the agent gets TOOL_DENIED with details.reason. */
  deny(reason?: string): boolean;
}
export interface ErrorDetail { code: string; message: string }

export interface PedelecSessionEventMap {
  statechange: CustomEvent<StateChangeDetail>;
  toolcall: CustomEvent<ToolCallDetail>;
  delta: CustomEvent<DeltaDetail>;
  turnend: CustomEvent<TurnEndDetail>;
  welcome: CustomEvent<WelcomeDetail>;
  error: CustomEvent<ErrorDetail>;
  toolstatus: CustomEvent<ToolStatusDetail>;
  toolprogress: CustomEvent<ToolProgressDetail>;
  approval: ApprovalEvent;
}

/** How `sendText` rejects: `message` for people, the rest for code. */
export interface PedelecTurnError extends Error {
  /** "TurnError" (Core ended the turn failed or cancelled), "NotConnectedError", "SessionClosedError" */
  name: string;
  /** the error code of a TurnError ("FRAME_TOO_LARGE", "TURN_LOST", ...); else null */
  code: string | null;
  /** "failed" | "cancelled" for a TurnError; else null */
  status: string | null;
}
export declare class PedelecSession extends EventTarget {
  /** Core's session id (kept across reloads of this tab). */
  readonly id: string | null;
  readonly state: SessionState;
  /**
   * Start a turn of the agent; resolves to its final reply. Rejects with a
   * `PedelecTurnError` if the turn failed, was cancelled or could not start.
   */
  sendText(text: string): Promise<string>;
  /** Close the session for good (no reconnect). */
  close(): void;
  /** The tool requests in flight. */
  readonly pending: PendingToolRequest[];
  /** Cancel a request in flight (ctx.cancelled; TOOL_CANCELLED after 2 s); false if none. */
  cancelTool(toolRequestId: string): boolean;
  /** Approve a request awaiting approval; false if it is not awaiting one. */
  approveTool(toolRequestId: string): boolean;
  /** Deny a request awaiting approval; false if it is not awaiting one. */
  denyTool(toolRequestId: string, reason?: string): boolean;
  addEventListener<K extends keyof PedelecSessionEventMap>(
    type: K, listener: (event: PedelecSessionEventMap[K]) => void,
    options?: boolean | AddEventListenerOptions): void;
  addEventListener(type: string, listener: EventListenerOrEventListenerObject | null,
    options?: boolean | AddEventListenerOptions): void;
  removeEventListener<K extends keyof PedelecSessionEventMap>(
    type: K, listener: (event: PedelecSessionEventMap[K]) => void,
    options?: boolean | EventListenerOptions): void;
  removeEventListener(type: string, listener: EventListenerOrEventListenerObject | null,
    options?: boolean | EventListenerOptions): void;
}

export interface Pedelec {
  pyodide: PyodideAPI;
  session: PedelecSession;
  /** Core's URL. */
  core: string;
  /** Whether the runtime was restored from Core's memory snapshot (else booted). */
  snapshot: boolean;
  /** Whether the page's tools are offered to the browser's agent on `document.modelContext`
   * (WebMCP: asked for, and the browser has it). */
  webmcp: boolean;
  /** Run Python in the namespace of the page's blocks (where `session` is bound). */
  runPython(code: string): Promise<unknown>;
}

export interface StartOptions {
  /** Core's URL (default: the origin that served pedelec-pyodide.js). */
  core?: string;
  /** URL of pyodide.mjs (default: Core's /pedelec/pyodide/pyodide.mjs). */
  pyodide?: string;
  /** URL of pyodide-lock.json (default: next to pyodide.mjs). */
  lock?: string;
  /** Extra packages from the lock to load at start. */
  packages?: string[];
  /** Keep the session id, token and delivery ledger in sessionStorage (default true). */
  storage?: boolean;
  /** Start from Core's memory snapshot when it fits (default true; `data-snapshot="off"`). */
  snapshot?: boolean;
  /** Offer the page's tools to the browser's own agent on `document.modelContext` (WebMCP;
   * default false; `data-webmcp` on the script tag, any value but "off"). */
  webmcp?: boolean;
}

/** Error of a failed start; `step` says which: loading Pyodide, loading packages, page code, connecting to Core (the classic script: also loading pedelec-pyodide.js). */
export declare class PedelecError extends Error {
  readonly step: string;
}

export declare const SCRIPT_TYPE: "pedelec/python";
export declare const PACKAGE: "pedelec-pyodide";
/** Start (once): load Pyodide, run the page's Python blocks, connect. */
export declare function start(options?: StartOptions): Promise<Pedelec>;

declare global {
  interface Window {
    pedelec?: Pedelec;
    pedelecReady?: Promise<Pedelec>;
  }
  interface DocumentEventMap {
    "pedelec:ready": CustomEvent<Pedelec>;
    "pedelec:error": CustomEvent<Error>;
  }
}
