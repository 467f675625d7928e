// Types of @keyhold/fingerprint/client (hand-written; client.js is plain JS).

/** Anything with the Web Storage methods the client uses. */
export interface IntentStorage {
  getItem(key: string): string | null;
  setItem(key: string, value: string): void;
  removeItem(key: string): void;
}

/** The customer's decision to place one order, persisted before sending. */
export interface Intent<Body = OrderBody> {
  /** The Idempotency-Key, made once (crypto.randomUUID) and reused on every retry. */
  key: string;
  body: Body;
  /** `sha256:<hex>` of the body under the built-in orders spec. */
  fingerprint: string;
  createdAt: string;
  /** Requests sent so far, across reloads. */
  attempts: number;
  lastAttemptAt?: string;
}

export interface OrderBody {
  client_order_id: string;
  cart_id: string;
  amount: number;
  currency: string;
  shipping_address_id?: string;
  items?: { sku: string; quantity: number }[];
  quote_id?: string;
  metadata?: Record<string, unknown>;
  [extra: string]: unknown;
}

export interface Order {
  order_id: string;
  client_order_id: string;
  cart_id: string;
  amount: number;
  currency: string;
  status: 'CONFIRMED' | 'PAID' | 'PAYMENT_FAILED' | string;
  home_region: string;
  created_at: string;
}

export interface StorageOptions {
  /** Defaults to globalThis.localStorage. */
  storage?: IntentStorage;
}

export interface AttemptInfo {
  attempt: number;
  key: string;
  /** HTTP status, when an answer arrived. */
  status?: number;
  body?: unknown;
  /** The network error, when none did. */
  error?: unknown;
}

export interface SubmitOptions extends StorageOptions {
  /** Origin of the keyhold node; '' for the page's own origin. */
  baseUrl: string;
  /** The tenant's bearer token. */
  token: string;
  fetch?: typeof fetch;
  signal?: AbortSignal;
  /** Default 8. */
  maxAttempts?: number;
  /** Default 250. */
  baseDelayMs?: number;
  /** Default 10000. */
  maxDelayMs?: number;
  /** Longest Retry-After honoured, default 60000. */
  maxRetryAfterMs?: number;
  onAttempt?: (info: AttemptInfo) => void;
  sleep?: (ms: number, signal?: AbortSignal) => Promise<void>;
  random?: () => number;
}

export interface SubmitResult {
  /** 201 (created), or 200 (an existing order for the client_order_id), or a replayed status. */
  status: number;
  order: Order;
  /** The server's Idempotent-Replayed header. */
  replayed: boolean;
  /** The Idempotency-Fingerprint the server computed. */
  fingerprint: string | null;
  /** The Idempotency-Fingerprint this client sent. */
  sentFingerprint: string;
  key: string;
  attempts: number;
}

export class SubmitError extends Error {
  status: number | null;
  /** The problem+json body, when the server answered. */
  problem: { type?: string; title?: string; status?: number; detail?: string } | null;
  /** True when the intent was kept and may be submitted again. */
  retryable: boolean;
  attempts: number;
}

export function loadFingerprinter(source?: BufferSource | URL | string | WebAssembly.Module): Promise<void>;
export function fingerprintOf(body: unknown): Promise<string>;
export function pendingIntents(options?: StorageOptions): Intent[];
export function discardIntent(intent: Intent, options?: StorageOptions): void;
export function createIntent<Body = OrderBody>(body: Body, options?: StorageOptions): Promise<Intent<Body>>;
export function intentFor<Body = OrderBody>(body: Body, options?: StorageOptions): Promise<Intent<Body>>;
export function submit(intent: Intent<unknown>, options: SubmitOptions): Promise<SubmitResult>;
export function retryAfterMs(value: string | null | undefined, now?: number): number | null;
export function backoffMs(
  attempt: number,
  limits: { baseDelayMs: number; maxDelayMs: number },
  random?: () => number,
): number;
