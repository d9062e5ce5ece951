import org.apache.logging.log4j.LogManager;
import org.apache.logging.log4j.Logger;
public class Probe {
  public static void main(String[] a) throws Exception {
    Logger log = LogManager.getLogger("org.pytorch.serve.Probe");
    int perSecond = Integer.parseInt(a[0]);
    int seconds = Integer.parseInt(a[1]);
    int n = 0;
    for (int s = 0; s < seconds; s++) {
      long start = System.currentTimeMillis();
      for (int i = 0; i < perSecond; i++) log.info("line {} padding-padding-padding-padding-padding-padding", n++);
      Thread.sleep(Math.max(0, 1000 - (System.currentTimeMillis() - start)));
    }
  }
}
